//! Minimal MessagePack writer and a resumable, bounds-checked reader for the subset the trace
//! format uses (nil, bool, integers, str, bin, array, map; floats and ext are only skipped).
//!
//! The reader never trusts a length prefix: every length is checked against the bytes actually
//! present before anything is allocated, so memory stays proportional to the input. Skipping an
//! unknown value is iterative (a pending-value counter), so deep nesting cannot overflow the stack.

use alloc::string::String;
use alloc::vec::Vec;

/// Why a read stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadErr {
    /// The value continues past the end of the buffer: wait for more bytes.
    Incomplete,
    /// The byte at `offset` (relative to the buffer) cannot start the expected value.
    Invalid { offset: usize, what: &'static str },
}

pub type ReadResult<T> = Result<T, ReadErr>;

// ---------------------------------------------------------------- writing

#[inline]
pub fn write_uint(out: &mut Vec<u8>, v: u64) {
    if v < 128 {
        out.push(v as u8);
    } else if v < 256 {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v < 65_536 {
        out.push(0xcd);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= u64::from(u32::MAX) {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

#[inline]
pub fn write_int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        write_uint(out, v as u64);
    } else if v >= -32 {
        out.push(v as i8 as u8);
    } else if v >= i64::from(i8::MIN) {
        out.extend_from_slice(&[0xd0, v as i8 as u8]);
    } else if v >= i64::from(i16::MIN) {
        out.push(0xd1);
        out.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= i64::from(i32::MIN) {
        out.push(0xd2);
        out.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

pub fn write_nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

#[inline]
pub fn write_array_len(out: &mut Vec<u8>, n: u32) {
    if n < 16 {
        out.push(0x90 | n as u8);
    } else if n < 65_536 {
        out.push(0xdc);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

pub fn write_map_len(out: &mut Vec<u8>, n: u32) {
    if n < 16 {
        out.push(0x80 | n as u8);
    } else if n < 65_536 {
        out.push(0xde);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdf);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

pub fn write_str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 256 {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 65_536 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

pub fn write_bin(out: &mut Vec<u8>, b: &[u8]) {
    let n = b.len();
    if n < 256 {
        out.extend_from_slice(&[0xc4, n as u8]);
    } else if n < 65_536 {
        out.push(0xc5);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xc6);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(b);
}

// ---------------------------------------------------------------- reading

/// A cursor over a byte slice. All reads are bounds-checked.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pub pos: usize,
}

/// The value kinds the reader distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    Bin,
    Array,
    Map,
    Ext,
}

impl<'a> Reader<'a> {
    pub const fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    #[inline]
    pub const fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    fn take(&mut self, n: usize) -> ReadResult<&'a [u8]> {
        if self.remaining() < n {
            return Err(ReadErr::Incomplete);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn byte(&mut self) -> ReadResult<u8> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(ReadErr::Incomplete),
        }
    }

    #[inline]
    fn be<const N: usize>(&mut self) -> ReadResult<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn invalid(&self, at: usize, what: &'static str) -> ReadErr {
        ReadErr::Invalid { offset: at, what }
    }

    /// Peeks at the kind of the next value without consuming it.
    pub fn peek_kind(&self) -> ReadResult<Kind> {
        let b = *self.buf.get(self.pos).ok_or(ReadErr::Incomplete)?;
        Ok(match b {
            0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => Kind::Int,
            0x80..=0x8f | 0xde | 0xdf => Kind::Map,
            0x90..=0x9f | 0xdc | 0xdd => Kind::Array,
            0xa0..=0xbf | 0xd9..=0xdb => Kind::Str,
            0xc0 => Kind::Nil,
            0xc2 | 0xc3 => Kind::Bool,
            0xc4..=0xc6 => Kind::Bin,
            0xca | 0xcb => Kind::Float,
            0xc7..=0xc9 | 0xd4..=0xd8 => Kind::Ext,
            _ => return Err(self.invalid(self.pos, "the reserved MessagePack byte 0xc1")),
        })
    }

    /// Reads any integer as i128 (covers u64 and i64).
    #[inline]
    pub fn int(&mut self) -> ReadResult<i128> {
        // Fast path: fixints, which most deltas are.
        if let Some(&b) = self.buf.get(self.pos)
            && !(0x80..0xe0).contains(&b)
        {
            self.pos += 1;
            return Ok(i128::from(b as i8));
        }
        self.int_slow()
    }

    #[inline(never)]
    fn int_slow(&mut self) -> ReadResult<i128> {
        let at = self.pos;
        let b = self.byte()?;
        Ok(match b {
            0x00..=0x7f => i128::from(b),
            0xe0..=0xff => i128::from(b as i8),
            0xcc => i128::from(self.byte()?),
            0xcd => i128::from(u16::from_be_bytes(self.be()?)),
            0xce => i128::from(u32::from_be_bytes(self.be()?)),
            0xcf => i128::from(u64::from_be_bytes(self.be()?)),
            0xd0 => i128::from(self.byte()? as i8),
            0xd1 => i128::from(i16::from_be_bytes(self.be()?)),
            0xd2 => i128::from(i32::from_be_bytes(self.be()?)),
            0xd3 => i128::from(i64::from_be_bytes(self.be()?)),
            _ => {
                self.pos = at;
                return Err(self.invalid(at, "an integer"));
            }
        })
    }

    /// Reads a non-negative integer that fits in u64.
    #[inline]
    pub fn uint(&mut self) -> ReadResult<u64> {
        let at = self.pos;
        // Fast path: positive fixint.
        if let Some(&b) = self.buf.get(self.pos)
            && b < 0x80
        {
            self.pos += 1;
            return Ok(u64::from(b));
        }
        let v = self.int()?;
        u64::try_from(v).map_err(|_| self.invalid(at, "a non-negative integer"))
    }

    #[inline]
    pub fn u32(&mut self) -> ReadResult<u32> {
        let at = self.pos;
        let v = self.uint()?;
        u32::try_from(v).map_err(|_| self.invalid(at, "an integer below 2^32"))
    }

    #[inline]
    pub fn i64(&mut self) -> ReadResult<i64> {
        let at = self.pos;
        let v = self.int()?;
        i64::try_from(v).map_err(|_| self.invalid(at, "a 64-bit signed integer"))
    }

    /// Reads nil (None) or an integer.
    pub fn opt_i32(&mut self) -> ReadResult<Option<i32>> {
        if self.peek_kind()? == Kind::Nil {
            self.pos += 1;
            return Ok(None);
        }
        let at = self.pos;
        let v = self.int()?;
        i32::try_from(v)
            .map(Some)
            .map_err(|_| self.invalid(at, "a 32-bit integer"))
    }

    pub fn array_len(&mut self) -> ReadResult<u32> {
        let at = self.pos;
        let b = self.byte()?;
        Ok(match b {
            0x90..=0x9f => u32::from(b & 0x0f),
            0xdc => u32::from(u16::from_be_bytes(self.be()?)),
            0xdd => u32::from_be_bytes(self.be()?),
            _ => {
                self.pos = at;
                return Err(self.invalid(at, "an array"));
            }
        })
    }

    pub fn map_len(&mut self) -> ReadResult<u32> {
        let at = self.pos;
        let b = self.byte()?;
        Ok(match b {
            0x80..=0x8f => u32::from(b & 0x0f),
            0xde => u32::from(u16::from_be_bytes(self.be()?)),
            0xdf => u32::from_be_bytes(self.be()?),
            _ => {
                self.pos = at;
                return Err(self.invalid(at, "a map"));
            }
        })
    }

    pub fn str_bytes(&mut self) -> ReadResult<&'a [u8]> {
        let at = self.pos;
        let b = self.byte()?;
        let n = match b {
            0xa0..=0xbf => usize::from(b & 0x1f),
            0xd9 => usize::from(self.byte()?),
            0xda => usize::from(u16::from_be_bytes(self.be()?)),
            0xdb => u32::from_be_bytes(self.be()?) as usize,
            _ => {
                self.pos = at;
                return Err(self.invalid(at, "a string"));
            }
        };
        self.take(n)
    }

    /// Reads a string, replacing invalid UTF-8 (trace strings come from untrusted programs).
    pub fn string(&mut self) -> ReadResult<String> {
        let b = self.str_bytes()?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }

    pub fn bin(&mut self) -> ReadResult<&'a [u8]> {
        let at = self.pos;
        let b = self.byte()?;
        let n = match b {
            0xc4 => usize::from(self.byte()?),
            0xc5 => usize::from(u16::from_be_bytes(self.be()?)),
            0xc6 => u32::from_be_bytes(self.be()?) as usize,
            _ => {
                self.pos = at;
                return Err(self.invalid(at, "binary data"));
            }
        };
        self.take(n)
    }

    /// Skips `count` complete values, iteratively (no recursion, no allocation).
    pub fn skip_values(&mut self, count: u64) -> ReadResult<()> {
        let mut pending = count;
        self.skip_pending(&mut pending)
    }

    /// [`Reader::skip_values`], resumable: skips values while `*pending > 0`. On `Incomplete`,
    /// `pos` and `*pending` stop at the last whole value (the start of the one cut off, or just
    /// past a container whose entries cannot all be present), so a later call over a longer
    /// buffer goes on from there: finding where a value ends costs one pass over its bytes
    /// however it arrives.
    pub fn skip_pending(&mut self, pending: &mut u64) -> ReadResult<()> {
        while *pending > 0 {
            let at = self.pos;
            match self.skip_one() {
                Ok(children) => *pending = *pending - 1 + children,
                Err(e) => {
                    self.pos = at;
                    return Err(e);
                }
            }
            // Every pending value needs at least one byte: fail fast on absurd counts.
            if *pending > self.remaining() as u64 {
                return Err(ReadErr::Incomplete);
            }
        }
        Ok(())
    }

    /// Skips one value's own bytes; the number of values it contains (which follow it).
    fn skip_one(&mut self) -> ReadResult<u64> {
        let at = self.pos;
        let b = self.byte()?;
        let mut children = 0u64;
        match b {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => {}
            0x80..=0x8f => children += 2 * u64::from(b & 0x0f),
            0x90..=0x9f => children += u64::from(b & 0x0f),
            0xa0..=0xbf => {
                self.take(usize::from(b & 0x1f))?;
            }
            0xcc | 0xd0 => {
                self.take(1)?;
            }
            0xcd | 0xd1 => {
                self.take(2)?;
            }
            0xce | 0xd2 | 0xca => {
                self.take(4)?;
            }
            0xcf | 0xd3 | 0xcb => {
                self.take(8)?;
            }
            0xc4 | 0xd9 => {
                let n = usize::from(self.byte()?);
                self.take(n)?;
            }
            0xc5 | 0xda => {
                let n = usize::from(u16::from_be_bytes(self.be()?));
                self.take(n)?;
            }
            0xc6 | 0xdb => {
                let n = u32::from_be_bytes(self.be()?) as usize;
                self.take(n)?;
            }
            0xd4 => {
                self.take(2)?;
            }
            0xd5 => {
                self.take(3)?;
            }
            0xd6 => {
                self.take(5)?;
            }
            0xd7 => {
                self.take(9)?;
            }
            0xd8 => {
                self.take(17)?;
            }
            0xc7 => {
                let n = usize::from(self.byte()?);
                self.take(n + 1)?;
            }
            0xc8 => {
                let n = usize::from(u16::from_be_bytes(self.be()?));
                self.take(n + 1)?;
            }
            0xc9 => {
                let n = u32::from_be_bytes(self.be()?) as usize;
                self.take(n.saturating_add(1))?;
            }
            0xdc => children += u64::from(u16::from_be_bytes(self.be()?)),
            0xdd => children += u64::from(u32::from_be_bytes(self.be()?)),
            0xde => children += 2 * u64::from(u16::from_be_bytes(self.be()?)),
            0xdf => children += 2 * u64::from(u32::from_be_bytes(self.be()?)),
            0xc1 => return Err(self.invalid(at, "a MessagePack value (0xc1 is reserved)")),
        }
        Ok(children)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn ints_round_trip_at_every_width_boundary() {
        let values: [i64; 16] = [
            0,
            1,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            i64::MAX,
            -1,
            -32,
            -33,
            -128,
            -129,
            -32_769,
            i64::MIN,
        ];
        for v in values {
            let mut out = vec![];
            write_int(&mut out, v);
            let mut r = Reader::new(&out);
            assert_eq!(r.int(), Ok(i128::from(v)), "value {v}");
            assert_eq!(r.remaining(), 0);
        }
        let mut out = vec![];
        write_uint(&mut out, u64::MAX);
        assert_eq!(Reader::new(&out).uint(), Ok(u64::MAX));
    }

    #[test]
    fn huge_length_prefix_is_incomplete_not_an_allocation() {
        let bytes = [0xdb, 0xff, 0xff, 0xff, 0xff, b'a'];
        assert_eq!(Reader::new(&bytes).str_bytes(), Err(ReadErr::Incomplete));
        let arr = [0xdd, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(Reader::new(&arr).skip_values(1), Err(ReadErr::Incomplete));
    }

    #[test]
    fn deep_nesting_is_skipped_without_recursion() {
        let mut bytes = vec![0x91u8; 1_000_000];
        bytes.push(0x01);
        let mut r = Reader::new(&bytes);
        assert_eq!(r.skip_values(1), Ok(()));
        assert_eq!(r.remaining(), 0);
    }
}
