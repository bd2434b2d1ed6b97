//! Writing command output to stdout without panicking when the reader goes away
//! (`gpucollect report run.msgpack | head`).

use std::io::Write;

use anyhow::{Context, Result};

/// Writes `text` to stdout. A closed pipe is not an error: the reader has what it wanted.
pub fn print(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("cannot write to stdout"),
    }
}
