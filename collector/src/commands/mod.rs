//! The analysis and sharing commands (`gpucollect report`, `check`, `diff`, `html`, `import`,
//! `demo`, `synth`, `upload`, `serve`), one module each, and what several of them share: the
//! output format and the detector configuration (`--config`, `--hide-frame`).

pub mod check;
pub mod demo;
pub mod diff;
pub mod html;
pub mod import;
pub mod report;
#[cfg(feature = "serve")]
pub mod serve;
pub mod synth;
pub mod upload;
#[cfg(feature = "serve")]
pub mod view;

use std::path::Path;

use analysis_core::Config;
use anyhow::{Context, Result};
use clap::ValueEnum;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

/// Reads detector thresholds from a JSON file (the defaults otherwise) and adds the frames
/// `--hide-frame` skips when naming the user's line.
pub fn load_config(path: Option<&Path>, hide_frames: &[String]) -> Result<Config> {
    let mut config = match path {
        None => Config::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the config {}", path.display()))?;
            serde_json::from_str(&text).with_context(|| {
                format!(
                    "the config is not valid: give a JSON object with keys from the report's `analysis.config` in {}",
                    path.display()
                )
            })?
        }
    };
    config
        .hide_frames
        .extend(hide_frames.iter().filter(|h| !h.is_empty()).cloned());
    Ok(config)
}
