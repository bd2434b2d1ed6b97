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

/// Writes a binary trace to `path`, or to stdout when `path` is `None`. A terminal never gets
/// binary bytes: that is refused with a hint.
pub fn write_trace(path: Option<&std::path::Path>, bytes: &[u8]) -> Result<()> {
    use std::io::IsTerminal;
    match path {
        Some(path) => std::fs::write(path, bytes)
            .with_context(|| format!("cannot write the trace to {}", path.display())),
        None => {
            let mut out = std::io::stdout().lock();
            if out.is_terminal() {
                anyhow::bail!(
                    "refusing to write a binary trace to the terminal: redirect it (`> run.msgpack`) or use -o FILE"
                );
            }
            out.write_all(bytes)
                .context("cannot write the trace to stdout")
        }
    }
}
