//! Native frame symbolization in the collector (never in the traced process): module path +
//! ELF virtual address -> function, file, line, with addr2line over the module's DWARF and its
//! symbol table as fallback. One loader per module, opened lazily and kept.

use std::collections::HashMap;

/// What a frame resolved to. Empty function when nothing is known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Symbol {
    pub function: String,
    pub file: String,
    pub line: u32,
}

#[derive(Default)]
pub struct Symbolizer {
    loaders: HashMap<String, Option<addr2line::Loader>>,
}

impl std::fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolizer")
            .field("modules", &self.loaders.len())
            .finish()
    }
}

impl Symbolizer {
    /// Resolves `svma` (address relative to the module's load bias) in the module at `path`.
    pub fn resolve(&mut self, path: &str, svma: u64) -> Symbol {
        let loader = self
            .loaders
            .entry(path.to_string())
            .or_insert_with(|| addr2line::Loader::new(path).ok());
        let Some(loader) = loader else {
            return Symbol::default();
        };
        let mut out = Symbol::default();
        if let Ok(mut frames) = loader.find_frames(svma)
            && let Ok(Some(frame)) = frames.next()
        {
            if let Some(f) = &frame.function {
                out.function = f.demangle().map(|c| c.into_owned()).unwrap_or_default();
            }
            if let Some(loc) = &frame.location {
                out.file = loc.file.unwrap_or("").to_string();
                out.line = loc.line.unwrap_or(0);
            }
        }
        if out.function.is_empty()
            && let Some(name) = loader.find_symbol(svma)
        {
            out.function = addr2line::demangle_auto(name.into(), None).into_owned();
        }
        out
    }
}
