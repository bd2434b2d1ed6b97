//! Decoding a trace on a thread of its own, ahead of the replay: the decoder
//! (`analysis_core::split_load::LoadDecoder`) turns the bytes a [`Source`] gives (a file or
//! stdin through [`ReadAhead`], the server's store stream) into batches of records, and the
//! calling thread replays them into the model (`LoadReplay`). The model is
//! the one the fused `Loader` builds (a test in analysis-core compares them); decoding was
//! about a sixth of the load's time on the replaying thread.

use std::io;
use std::sync::mpsc::{Receiver, Sender, channel, sync_channel};
use std::thread::JoinHandle;

use analysis_core::split_load::{Decoded, LoadDecoder, LoadReplay};
use analysis_core::{DecodeError, LoadedTrace};
use anyhow::{Result, anyhow};

use crate::read_ahead::ReadAhead;

/// Bytes decoded into one batch: about 5,000 records of a collector's trace, a batch of
/// about half a megabyte, so the batches in flight stay in the processor's cache.
const PIECE_BYTES: usize = 64 << 10;

/// Records a new batch has room for (a record is 12 bytes in a typical trace).
const BATCH_RECORDS: usize = PIECE_BYTES / 8;

/// Batches decoded and not yet replayed.
const AHEAD: usize = 2;

/// Where the decoding thread takes a trace's bytes from.
pub trait Source: Send + 'static {
    /// The next bytes, or `None` at the end.
    fn next_chunk(&mut self) -> io::Result<Option<&[u8]>>;
}

impl Source for ReadAhead {
    fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
        ReadAhead::next_chunk(self)
    }
}

/// Replays `first` (the bytes of `source` already taken) and everything `source` gives after
/// it, both decoded on another thread, into `replay`. `after_batch` sees the replay after each
/// batch and stops the load by returning `false` (the model is then finished as far as it
/// went). A stop of the decoder or of the replay (a damaged or too dense trace) is not an
/// error here: the inner result reports it with everything before it, as the fused `Loader`
/// does; the outer error is a read that failed.
pub fn load(
    first: Vec<u8>,
    source: impl Source,
    mut replay: LoadReplay,
    mut after_batch: impl FnMut(&LoadReplay) -> bool,
) -> Result<Result<LoadedTrace, DecodeError>> {
    let ahead = DecodeThread::start(first, source)?;
    while let Ok(next) = ahead.batches.recv() {
        let mut batch = next?;
        let replayed = replay.replay(&mut batch);
        // A full or closed channel (the decoder has stopped) drops the batch instead.
        let _ = ahead.empties.send(batch);
        if replayed.is_err() || !after_batch(&replay) {
            break;
        }
    }
    // The model's last pass (what is live at the peak, in two halves of the history) on both
    // cores.
    Ok(replay.finish_with(ahead.finish()?, &crate::threads::Threads))
}

/// The decoding thread and the channels to and from it.
struct DecodeThread {
    /// Batches decoded, in order; the channel closes at the end of the input, at a read error
    /// (its last message) or when the decoder stops.
    batches: Receiver<io::Result<Decoded>>,
    /// Batches replayed, back to the decoder to fill again.
    empties: Sender<Decoded>,
    thread: JoinHandle<LoadDecoder>,
}

impl DecodeThread {
    /// Starts decoding `first`, then what `source` gives.
    fn start(first: Vec<u8>, mut source: impl Source) -> io::Result<Self> {
        let (to_replay, batches) = sync_channel(AHEAD);
        let (empties, emptied) = channel::<Decoded>();
        let thread = std::thread::Builder::new()
            .name("gpucollect-decode".into())
            .spawn(move || {
                let mut decoder = LoadDecoder::new();
                // Decodes a chunk into batches for the replay: `false` once decoding or the
                // replay has stopped (a send fails once the replay has dropped the receiver).
                let mut decode = |chunk: &[u8]| {
                    chunk.chunks(PIECE_BYTES).all(|piece| {
                        let mut batch = emptied
                            .try_recv()
                            .unwrap_or_else(|_| Decoded::with_capacity(BATCH_RECORDS));
                        let decoded = decoder.push(piece, &mut batch);
                        (batch.is_empty() || to_replay.send(Ok(batch)).is_ok()) && decoded.is_ok()
                    })
                };
                if decode(&first) {
                    loop {
                        match source.next_chunk() {
                            Ok(Some(chunk)) if decode(chunk) => {}
                            Ok(_) => break,
                            Err(e) => {
                                let _ = to_replay.send(Err(e));
                                break;
                            }
                        }
                    }
                }
                decoder
            })?;
        Ok(Self {
            batches,
            empties,
            thread,
        })
    }

    /// Stops the thread (if the replay stopped first, its next send fails) and takes its
    /// decoder back.
    fn finish(self) -> Result<LoadDecoder> {
        drop(self.batches);
        self.thread
            .join()
            .map_err(|_| anyhow!("the thread decoding the trace failed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use analysis_core::synth::{Scenario, generate};

    /// Chunks of a trace, then (optionally) a read error.
    struct Pieces {
        rest: Vec<Vec<u8>>,
        current: Vec<u8>,
        fail_at_end: bool,
    }

    impl Source for Pieces {
        fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
            if self.rest.is_empty() {
                return if std::mem::take(&mut self.fail_at_end) {
                    Err(io::Error::other("the disk went away"))
                } else {
                    Ok(None)
                };
            }
            self.current = self.rest.remove(0);
            Ok(Some(&self.current))
        }
    }

    fn pieces(bytes: &[u8], fail_at_end: bool) -> (Vec<u8>, Pieces) {
        let mut chunks: Vec<Vec<u8>> = bytes.chunks(100_003).map(<[u8]>::to_vec).collect();
        let first = chunks.remove(0);
        let p = Pieces {
            rest: chunks,
            current: Vec::new(),
            fail_at_end,
        };
        (first, p)
    }

    #[test]
    fn a_trace_decoded_ahead_gives_the_report_of_one_loaded_whole() {
        let (bytes, _) = generate(Scenario::TrainingLeak, 200_000, 3);
        let (first, source) = pieces(&bytes, false);
        let mut batches = 0;
        let got = load(first, source, LoadReplay::new(), |_| {
            batches += 1;
            true
        })
        .expect("reads")
        .expect("decodes");
        let want = analysis_core::load(&bytes).expect("loads");
        assert!(batches > 10, "{batches} batches");
        assert_eq!(got.bytes, want.bytes);
        assert_eq!(got.model.records, want.model.records);
        assert_eq!(
            analysis_core::summarize(&got),
            analysis_core::summarize(&want)
        );
    }

    #[test]
    fn a_read_error_is_an_error_and_a_stop_keeps_what_came_before() {
        let (bytes, _) = generate(Scenario::TrainingLeak, 200_000, 3);
        let (first, source) = pieces(&bytes, true);
        let e = load(first, source, LoadReplay::new(), |_| true).expect_err("the read failed");
        assert!(format!("{e:#}").contains("the disk went away"), "{e:#}");

        let (first, source) = pieces(&bytes, false);
        let mut last = 0;
        let stopped = load(first, source, LoadReplay::new(), |r| {
            last = r.bytes_replayed();
            last < 500_000
        })
        .expect("reads")
        .expect("decodes");
        let whole = analysis_core::load(&bytes).expect("loads");
        assert!(last >= 500_000 && last < whole.bytes);
        assert_eq!(stopped.bytes, last, "the bytes replayed, not those decoded");
        assert!(stopped.model.records < whole.model.records);
    }
}
