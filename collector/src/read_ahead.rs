//! Reading a trace a buffer ahead of its decoder, on a thread of its own: the kernel's copy of
//! the next megabyte (a tenth of `report`'s load time at 300M events, on the decoding thread
//! before) overlaps the decode of this one.

use std::io::{ErrorKind, Read, Result};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// Bytes asked of the source per read.
pub const BUFFER_BYTES: usize = 1 << 20;

/// Buffers read and not yet taken: with the one being read and the one being decoded, at most
/// four buffers are in use.
const AHEAD: usize = 2;

/// A source read on another thread; its bytes come in buffers ([`Self::next_chunk`]) or
/// through [`Read`].
pub struct ReadAhead {
    /// Buffers read, in order; an empty one is the end, and so is the channel closing.
    full: Receiver<Result<Vec<u8>>>,
    /// Buffers decoded, back to the reader to fill again.
    empty: SyncSender<Vec<u8>>,
    current: Vec<u8>,
    /// Bytes of `current` already handed out.
    at: usize,
}

impl ReadAhead {
    /// Starts reading `source`; fails only where no thread can be started.
    pub fn new(mut source: impl Read + Send + 'static) -> Result<Self> {
        let (to_decoder, full) = sync_channel(AHEAD);
        let (empty, emptied) = sync_channel::<Vec<u8>>(AHEAD + 2);
        std::thread::Builder::new()
            .name("gpucollect-read".into())
            .spawn(move || {
                loop {
                    let mut buf = emptied.try_recv().unwrap_or_default();
                    buf.resize(BUFFER_BYTES, 0);
                    let read = loop {
                        match source.read(&mut buf) {
                            Err(e) if e.kind() == ErrorKind::Interrupted => {}
                            r => break r,
                        }
                    };
                    let last = !matches!(read, Ok(n) if n > 0);
                    let sent = to_decoder.send(read.map(|n| {
                        buf.truncate(n);
                        buf
                    }));
                    // Stopped at the end, at an error, or when the decoder is gone.
                    if last || sent.is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self {
            full,
            empty,
            current: Vec::new(),
            at: 0,
        })
    }

    /// The next bytes of the source, or `None` at its end.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>> {
        if self.at == self.current.len() && !self.refill()? {
            return Ok(None);
        }
        let at = std::mem::replace(&mut self.at, self.current.len());
        Ok(Some(&self.current[at..]))
    }

    /// Hands the buffer taken back to the reader and waits for the next: `false` at the end.
    fn refill(&mut self) -> Result<bool> {
        let done = std::mem::take(&mut self.current);
        if done.capacity() > 0 {
            // A full queue (the reader has stopped) drops the buffer instead.
            let _ = self.empty.try_send(done);
        }
        self.at = 0;
        match self.full.recv() {
            Ok(Ok(buf)) => {
                self.current = buf;
                Ok(!self.current.is_empty())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(false),
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> Result<usize> {
        if self.at == self.current.len() && !self.refill()? {
            return Ok(0);
        }
        let n = out.len().min(self.current.len() - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that returns short reads of varying length, then fails or ends.
    struct Uneven {
        bytes: Vec<u8>,
        at: usize,
        fail_at_end: bool,
    }

    impl Read for Uneven {
        fn read(&mut self, out: &mut [u8]) -> Result<usize> {
            if self.at == self.bytes.len() {
                return if self.fail_at_end {
                    Err(std::io::Error::other("disk gone"))
                } else {
                    Ok(0)
                };
            }
            let n = out
                .len()
                .min(self.bytes.len() - self.at)
                .min(1 + self.at % 70_001);
            out[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn source(len: usize, fail_at_end: bool) -> Uneven {
        let bytes = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        Uneven {
            bytes,
            at: 0,
            fail_at_end,
        }
    }

    #[test]
    fn chunks_hold_every_byte_in_order() {
        let len = 3 * BUFFER_BYTES + 12_345;
        let want = source(len, false).bytes;
        let mut r = ReadAhead::new(source(len, false)).expect("a thread");
        let mut got = Vec::new();
        while let Some(c) = r.next_chunk().expect("no error") {
            got.extend_from_slice(c);
        }
        assert_eq!(got, want);
        assert!(r.next_chunk().expect("still the end").is_none());
    }

    #[test]
    fn reads_and_chunks_mix() {
        let len = 2 * BUFFER_BYTES + 99;
        let want = source(len, false).bytes;
        let mut r = ReadAhead::new(source(len, false)).expect("a thread");
        let mut got = vec![0u8; 1000];
        r.read_exact(&mut got).expect("the first bytes");
        while let Some(c) = r.next_chunk().expect("no error") {
            got.extend_from_slice(c);
        }
        assert_eq!(got, want);
        assert_eq!(r.read(&mut [0u8; 8]).expect("the end"), 0);
    }

    #[test]
    fn an_error_comes_after_the_bytes_before_it() {
        let len = BUFFER_BYTES + 5;
        let mut r = ReadAhead::new(source(len, true)).expect("a thread");
        let mut got = 0;
        let err = loop {
            match r.next_chunk() {
                Ok(Some(c)) => got += c.len(),
                Ok(None) => panic!("the source failed; the end is not what it gave"),
                Err(e) => break e,
            }
        };
        assert_eq!(got, len);
        assert_eq!(err.to_string(), "disk gone");
    }
}
