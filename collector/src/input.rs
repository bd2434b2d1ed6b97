//! Reading traces from a file or stdin, streamed through the push decoder.

use std::fs::File;
use std::io::{IsTerminal, Read};
use std::path::Path;

use analysis_core::split_load::LoadReplay;
use analysis_core::torch_snapshot::{ImportSummary, SnapshotLoader};
use analysis_core::units::fmt_duration;
use analysis_core::{LoadedTrace, Loader};
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};

use crate::read_ahead::ReadAhead;

/// Bytes read at a time: the read-ahead's buffer, for the readers that do not go through it.
const CHUNK_BYTES: usize = crate::read_ahead::BUFFER_BYTES;

/// Loads a trace from `path`, or from stdin when `path` is `-`. Shows a progress bar for large
/// files when stderr is a terminal. Fails only when nothing could be decoded at all.
pub fn load_trace(path: &Path) -> Result<LoadedTrace> {
    let (reader, len): (Box<dyn Read + Send>, Option<u64>) = if path == Path::new("-") {
        if std::io::stdin().is_terminal() {
            bail!(
                "no trace on stdin: pipe one in (`gpucollect report - < run.msgpack`) or give a path"
            );
        }
        (Box::new(std::io::stdin()), None)
    } else {
        let f = File::open(path)
            .with_context(|| format!("cannot open the trace {}", path.display()))?;
        let len = f.metadata().ok().map(|m| m.len());
        if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            bail!("{} is a directory, not a trace file", path.display());
        }
        (Box::new(f), len)
    };
    let bar = match len {
        Some(n) if n > 64 * CHUNK_BYTES as u64 && std::io::stderr().is_terminal() => {
            let b = ProgressBar::new(n);
            b.set_style(
                ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            Some(b)
        }
        _ => None,
    };
    let mut reader = ReadAhead::new(reader).context("cannot start a thread to read the trace")?;
    let cannot_read = || format!("cannot read the trace {}", path.display());
    let first = reader
        .next_chunk()
        .with_context(cannot_read)?
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    if analysis_core::torch_snapshot::looks_like_snapshot(&first) {
        // A PyTorch memory snapshot (pickle or JSON), parsed as it is read, then converted
        // straight into the model: the same one the viewer builds (and the same as decoding
        // the bytes `gpucollect import` writes).
        let mut snapshot = SnapshotLoader::new(len.and_then(|l| usize::try_from(l).ok()));
        let read = snapshot
            .push(&first)
            .with_context(|| not_a_snapshot(path))
            .and_then(|()| {
                let mut buf = vec![0u8; CHUNK_BYTES];
                feed_snapshot(&mut snapshot, &mut reader, &mut buf, bar.as_ref(), path)
            })
            .and_then(|()| snapshot.finish().with_context(|| not_a_snapshot(path)));
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        return read.map(|(trace, _)| trace);
    }
    // Decoded on another thread, replayed on this one; a long trace's history goes to disk
    // past a budget (`spill`).
    let replay = LoadReplay::with_spill(crate::spill::FileSpill::in_temp_dir());
    let loaded = crate::decode_ahead::load(first, reader, replay, |r| {
        if let Some(b) = &bar {
            b.set_position(r.bytes_replayed());
            b.set_message(format!("{} records", r.records_replayed()));
        }
        true
    })
    .with_context(cannot_read)?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let trace = loaded.with_context(|| format!("cannot decode {}", path.display()))?;
    if !trace.model.clean_end
        && let Some(age) = written_within(path, STILL_WRITTEN)
    {
        let m = &trace.model;
        eprintln!(
            "gpucollect: {} has no end record and changed {} ago: a capture is probably still \
             writing it, so this covers its first {} ({} allocations so far)",
            path.display(),
            fmt_duration(u64::try_from(age.as_nanos()).unwrap_or(u64::MAX)),
            fmt_duration(m.last_ts_nanos.saturating_sub(m.first_ts_nanos)),
            m.allocs.len()
        );
    }
    Ok(trace)
}

/// A trace without an end record that changed this recently is taken to be still written.
const STILL_WRITTEN: std::time::Duration = std::time::Duration::from_secs(10);

/// How long ago the file at `path` changed, if within `limit` (never for stdin).
fn written_within(path: &Path, limit: std::time::Duration) -> Option<std::time::Duration> {
    if path == Path::new("-") {
        return None;
    }
    let age = std::fs::metadata(path)
        .ok()?
        .modified()
        .ok()?
        .elapsed()
        .ok()?;
    (age <= limit).then_some(age)
}

/// The context of an error in a snapshot's content.
fn not_a_snapshot(path: &Path) -> String {
    format!(
        "cannot read {} as a PyTorch memory snapshot",
        path.display()
    )
}

/// Pushes the rest of `reader` (read into `buf`) into `snapshot`: the file is never held
/// whole, only the snapshot's parsed values.
fn feed_snapshot(
    snapshot: &mut SnapshotLoader,
    reader: &mut dyn Read,
    buf: &mut [u8],
    bar: Option<&ProgressBar>,
    path: &Path,
) -> Result<()> {
    loop {
        let n = match reader.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        snapshot
            .push(&buf[..n])
            .with_context(|| not_a_snapshot(path))?;
        if let Some(b) = bar {
            b.set_position(snapshot.bytes_read());
        }
    }
}

/// Opens `path` and reads its first bytes (what they are tells a trace from a snapshot); the
/// file, its size and those bytes. `what` names the file in errors ("trace", "snapshot").
pub fn open_with_head(path: &Path, what: &str) -> Result<(File, Option<u64>, Vec<u8>)> {
    let mut file =
        File::open(path).with_context(|| format!("cannot open the {what} {}", path.display()))?;
    let size = file.metadata().ok().map(|m| m.len());
    let mut head = Vec::with_capacity(HEAD_BYTES);
    (&mut file)
        .take(HEAD_BYTES as u64)
        .read_to_end(&mut head)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    Ok((file, size, head))
}

/// Reads the rest of a trace whose first bytes are `head` into memory, decoding it as it is
/// read: reading stops at the first byte that cannot be a trace (so `/dev/zero`, or any file
/// that is not a trace, costs one chunk, never all of it). Fails when not even the header could
/// be read; a trace damaged further on is kept up to the read that found the damage.
pub fn read_trace_bytes(head: Vec<u8>, reader: &mut dyn Read, path: &Path) -> Result<Vec<u8>> {
    let mut loader = Loader::new();
    let mut all = head;
    let mut stopped = loader.push(&all).is_err();
    let mut buf = vec![0u8; CHUNK_BYTES];
    while !stopped {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        all.extend_from_slice(&buf[..n]);
        stopped = loader.push(&buf[..n]).is_err();
    }
    loader
        .finish()
        .with_context(|| format!("{} is not a trace", path.display()))?;
    Ok(all)
}

/// Bytes [`open_with_head`] reads first.
const HEAD_BYTES: usize = 4096;

/// Converts the PyTorch memory snapshot at `path` to trace bytes, reading it in pieces (the
/// file is never held whole), with errors naming the file. `head` is what was read of it
/// already.
pub fn convert_snapshot_file(
    head: &[u8],
    reader: &mut dyn Read,
    size_hint: Option<u64>,
    path: &Path,
) -> Result<(Vec<u8>, ImportSummary)> {
    let mut snapshot = SnapshotLoader::new(size_hint.and_then(|l| usize::try_from(l).ok()));
    snapshot.push(head).with_context(|| not_a_snapshot(path))?;
    let mut buf = vec![0u8; CHUNK_BYTES];
    feed_snapshot(&mut snapshot, reader, &mut buf, None, path)?;
    snapshot
        .finish_trace_bytes()
        .with_context(|| not_a_snapshot(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gpucollect html /dev/zero` read until memory ran out: the bytes are now decoded as they
    /// are read, and the first one that cannot start a trace stops the reading.
    #[test]
    fn an_endless_input_that_is_not_a_trace_stops_at_once() {
        let mut zeros = std::io::repeat(0).take(1 << 40);
        let err = read_trace_bytes(vec![0; HEAD_BYTES], &mut zeros, Path::new("/dev/zero"))
            .expect_err("not a trace");
        assert!(
            format!("{err:#}").contains("not a gpucollect trace"),
            "{err:#}"
        );
        assert!(zeros.limit() >= (1 << 40) - 2 * CHUNK_BYTES as u64);
    }

    #[test]
    fn a_trace_reads_whole_and_unchanged() {
        let (trace, _) =
            analysis_core::synth::generate(analysis_core::synth::Scenario::TrainingLeak, 2_000, 1);
        let (head, rest) = trace.split_at(HEAD_BYTES.min(trace.len()));
        let got = read_trace_bytes(head.to_vec(), &mut &rest[..], Path::new("t")).expect("reads");
        assert_eq!(got, trace);
    }
}
