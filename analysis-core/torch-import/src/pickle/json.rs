//! Snapshots as JSON, read as they arrive: a push parser that builds the same arena as a
//! pickle's ([`JsonBuilder`]) from pieces of text, keeping only a token cut at a piece's end.
//! So a JSON snapshot is parsed while the rest of the file is still being read, and never held
//! whole (before, the whole text was kept until it could be parsed at once: 1.2-1.7 times the
//! file in memory with the arena).
//!
//! The grammar is RFC 8259's, strictly (no trailing commas, comments, leading zeros or
//! non-finite numbers), with serde_json's choices where JSON leaves them open, so that it reads
//! what the previous serde_json parse read into the same values: integers as `i64`/`u64`
//! (larger ones as floats), `-0` as a float, invalid UTF-8 and lone surrogates as errors,
//! nesting deeper than 128 as an error.

use alloc::string::String;
use alloc::vec::Vec;

use super::{
    JsonBuilder, PARSE_HEAP_FREE, PARSE_HEAP_PER_INPUT_BYTE, Pickle, Value, float_value, int_value,
};

/// Nesting deeper than this is an error (serde_json's limit), not a deep stack.
const MAX_DEPTH: usize = 128;

/// Values completed (containers included) between checks of the heap.
const CHECK_EVERY: u32 = 1 << 12;

/// Why JSON text could not be read, and where (a byte offset in the whole text).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {offset}")]
pub struct JsonError {
    pub what: &'static str,
    pub offset: u64,
}

/// What comes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// A value (the root, an array item after a comma, an object value after its colon).
    Value,
    /// An array's first item or its end.
    ValueOrClose,
    /// An object's first key or its end.
    KeyOrClose,
    /// An object key (after a comma).
    Key,
    Colon,
    CommaOrClose,
    /// Nothing but whitespace (the root is complete).
    End,
}

/// A container being read: where its items (or pairs) start on the builder's stacks, and for
/// an object the key whose value is being read.
#[derive(Clone, Copy, Debug)]
enum Open {
    Array { start: usize },
    Object { start: usize, key: Value },
}

/// The push parser (see the module's documentation).
pub struct JsonParser {
    b: JsonBuilder,
    open: Vec<Open>,
    expect: Expect,
    root: Option<Value>,
    /// Text not parsed yet: a token cut at the end of the last piece (empty otherwise).
    pending: Vec<u8>,
    /// Bytes of `pending` already scanned without finding the token's end (a long string or
    /// number cut many times is not scanned again from its start).
    scanned: usize,
    /// Offset in the whole text of `pending`'s first byte (or of the next piece's).
    base: u64,
    /// Decoded strings with escapes.
    scratch: String,
    failed: Option<JsonError>,
    /// Values completed since the heap was last checked.
    unchecked: u32,
}

impl Default for JsonParser {
    fn default() -> Self {
        Self::new()
    }
}

/// The end of a token starting at `b[0]`, if it is complete within `b` (`at_end`: no more text
/// comes). `from`: bytes already scanned without finding it.
enum Scan {
    Complete(usize),
    /// Cut by the end of `b`; scanned this far.
    Cut(usize),
}

impl JsonParser {
    pub fn new() -> Self {
        Self {
            b: JsonBuilder::new(),
            open: Vec::new(),
            expect: Expect::Value,
            root: None,
            pending: Vec::new(),
            scanned: 0,
            base: 0,
            scratch: String::new(),
            failed: None,
            unchecked: 0,
        }
    }

    /// Parses `piece` as far as its tokens are complete.
    pub fn push(&mut self, piece: &[u8]) -> Result<(), JsonError> {
        self.run(piece, false)
    }

    /// Ends the text: the arena of the complete value, or why there is none.
    pub fn finish(mut self) -> Result<Pickle, JsonError> {
        self.run(&[], true)?;
        let mut p = self.b.p;
        p.root = self.root;
        Ok(p)
    }

    fn run(&mut self, piece: &[u8], at_end: bool) -> Result<(), JsonError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = if self.pending.is_empty() {
            // Straight from the piece; only a cut token is copied.
            let r = self.parse(piece, at_end);
            if let Ok(done) = r {
                self.pending.extend_from_slice(&piece[done..]);
                self.base += done as u64;
            }
            r
        } else {
            let mut text = core::mem::take(&mut self.pending);
            text.extend_from_slice(piece);
            let r = self.parse(&text, at_end);
            if let Ok(done) = r {
                text.drain(..done);
                self.base += done as u64;
            }
            self.pending = text;
            r
        };
        match result {
            Ok(_) => Ok(()),
            Err(e) => {
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    fn error(&self, what: &'static str, at: usize) -> JsonError {
        JsonError {
            what,
            offset: self.base + at as u64,
        }
    }

    /// Refuses to go on once the tables hold more than [`PARSE_HEAP_PER_INPUT_BYTE`] bytes
    /// of heap per byte of text up to `t[at]` plus [`PARSE_HEAP_FREE`] (as a pickle's parser
    /// does: `[]` is 2 bytes of text and 20 of arena). Checked after the same values however
    /// the text is cut, on what grows the same way (not the buffers of a cut token, which are
    /// at most the token), so the result does not depend on the pieces.
    fn check_heap(&mut self, at: usize) -> Result<(), JsonError> {
        self.unchecked = 0;
        let parsed = usize::try_from(self.base).unwrap_or(usize::MAX) + at;
        let limit = PARSE_HEAP_PER_INPUT_BYTE
            .saturating_mul(parsed)
            .saturating_add(PARSE_HEAP_FREE);
        let open = self.open.capacity() * core::mem::size_of::<Open>();
        if self.b.heap_bytes() + open > limit {
            return Err(self.error(
                "the JSON packs more values into its text than gpucollect reads (over 4 bytes \
                 of memory per byte of text, plus 32 MiB; a PyTorch snapshot takes far less): \
                 refused, so that memory stays proportional to the file",
                at,
            ));
        }
        Ok(())
    }

    /// Parses the complete tokens of `t`; how many bytes were used (the rest is a cut token).
    fn parse(&mut self, t: &[u8], at_end: bool) -> Result<usize, JsonError> {
        let mut i = 0;
        loop {
            while i < t.len() && matches!(t[i], b' ' | b'\t' | b'\n' | b'\r') {
                i += 1;
            }
            let Some(&c) = t.get(i) else {
                if at_end && self.expect != Expect::End {
                    return Err(self.error("the text ends early (the file is truncated)", i));
                }
                return Ok(i);
            };
            match (self.expect, c, self.open.last().copied()) {
                (Expect::End, _, _) => return Err(self.error("trailing characters", i)),
                (Expect::Colon, b':', _) => {
                    self.expect = Expect::Value;
                    i += 1;
                }
                (Expect::Colon, _, _) => return Err(self.error("expected `:`", i)),
                (Expect::CommaOrClose, b',', top) => {
                    self.expect = match top {
                        Some(Open::Object { .. }) => Expect::Key,
                        _ => Expect::Value,
                    };
                    i += 1;
                }
                (
                    Expect::CommaOrClose | Expect::ValueOrClose,
                    b']',
                    Some(Open::Array { start }),
                ) => {
                    self.open.pop();
                    let v = self.b.list(start);
                    i += 1;
                    self.complete(v, i)?;
                }
                (
                    Expect::CommaOrClose | Expect::KeyOrClose,
                    b'}',
                    Some(Open::Object { start, .. }),
                ) => {
                    self.open.pop();
                    let v = self.b.dict(start);
                    i += 1;
                    self.complete(v, i)?;
                }
                (Expect::CommaOrClose, _, _) => {
                    return Err(self.error("expected `,` or the container's end", i));
                }
                (Expect::Key | Expect::KeyOrClose, b'"', _) => {
                    let Some((v, end)) = self.string(t, i, at_end)? else {
                        return Ok(i);
                    };
                    i = end;
                    if let Some(Open::Object { key, .. }) = self.open.last_mut() {
                        *key = v;
                    }
                    self.expect = Expect::Colon;
                }
                (Expect::Key | Expect::KeyOrClose, _, _) => {
                    return Err(self.error("key must be a string", i));
                }
                (Expect::Value | Expect::ValueOrClose, b'[' | b'{', _) => {
                    if self.open.len() >= MAX_DEPTH {
                        return Err(self.error("recursion limit exceeded", i));
                    }
                    if c == b'[' {
                        self.open.push(Open::Array {
                            start: self.b.items.len(),
                        });
                        self.expect = Expect::ValueOrClose;
                    } else {
                        self.open.push(Open::Object {
                            start: self.b.pairs.len(),
                            key: Value::None,
                        });
                        self.expect = Expect::KeyOrClose;
                    }
                    i += 1;
                }
                (Expect::Value | Expect::ValueOrClose, b'"', _) => {
                    let Some((v, end)) = self.string(t, i, at_end)? else {
                        return Ok(i);
                    };
                    i = end;
                    self.complete(v, i)?;
                }
                (Expect::Value | Expect::ValueOrClose, b'-' | b'0'..=b'9', _) => {
                    let Some((v, end)) = self.number(t, i, at_end)? else {
                        return Ok(i);
                    };
                    i = end;
                    self.complete(v, i)?;
                }
                (Expect::Value | Expect::ValueOrClose, b't' | b'f' | b'n', _) => {
                    let (word, v): (&[u8], Value) = match c {
                        b't' => (b"true", Value::Bool(true)),
                        b'f' => (b"false", Value::Bool(false)),
                        _ => (b"null", Value::None),
                    };
                    let have = &t[i..t.len().min(i + word.len())];
                    if !word.starts_with(have) {
                        return Err(self.error("expected ident", i));
                    }
                    if have.len() < word.len() {
                        if at_end {
                            return Err(
                                self.error("the text ends early (the file is truncated)", t.len())
                            );
                        }
                        return Ok(i);
                    }
                    i += word.len();
                    self.complete(v, i)?;
                }
                (Expect::Value | Expect::ValueOrClose, _, _) => {
                    return Err(self.error("expected value", i));
                }
            }
        }
    }

    /// A value is complete: the root, an array's item or an object's value, ending before
    /// `t[end]`; every [`CHECK_EVERY`] values, the heap is checked.
    fn complete(&mut self, v: Value, end: usize) -> Result<(), JsonError> {
        match self.open.last() {
            None => {
                self.root = Some(v);
                self.expect = Expect::End;
            }
            Some(Open::Array { .. }) => {
                self.b.items.push(v);
                self.expect = Expect::CommaOrClose;
            }
            Some(&Open::Object { key, .. }) => {
                self.b.pairs.push((key, v));
                self.expect = Expect::CommaOrClose;
            }
        }
        self.unchecked += 1;
        if self.unchecked >= CHECK_EVERY {
            self.check_heap(end)?;
        }
        Ok(())
    }

    /// Where the token starting at `t[i]` ends, scanning from where an earlier call stopped.
    fn scan(
        &mut self,
        t: &[u8],
        i: usize,
        at_end: bool,
        end_of: impl Fn(&[u8], usize) -> Scan,
    ) -> Result<Option<usize>, JsonError> {
        // `scanned` belongs to a token at the start of `pending`, which is where a cut token is.
        let from = if i == 0 { self.scanned } else { 0 };
        match end_of(&t[i..], from) {
            Scan::Complete(n) => {
                self.scanned = 0;
                Ok(Some(i + n))
            }
            Scan::Cut(_) if at_end => {
                Err(self.error("the text ends early (the file is truncated)", t.len()))
            }
            Scan::Cut(n) => {
                self.scanned = n;
                Ok(None)
            }
        }
    }

    /// The string token at `t[i]` (its opening quote), as a value, and where it ends; `None`
    /// while it is cut.
    fn string(
        &mut self,
        t: &[u8],
        i: usize,
        at_end: bool,
    ) -> Result<Option<(Value, usize)>, JsonError> {
        let Some(end) = self.scan(t, i, at_end, |s, from| {
            let mut k = from.max(1);
            while k < s.len() {
                match s[k] {
                    b'"' => return Scan::Complete(k + 1),
                    // An escape's next byte is never the end (the scan resumes before a
                    // trailing backslash).
                    b'\\' if k + 1 < s.len() => k += 2,
                    b'\\' => return Scan::Cut(k),
                    _ => k += 1,
                }
            }
            Scan::Cut(k.min(s.len()))
        })?
        else {
            return Ok(None);
        };
        let body = &t[i + 1..end - 1];
        let at = |k: usize| i + 1 + k;
        if !body.contains(&b'\\') {
            if let Some(k) = body.iter().position(|&c| c < 0x20) {
                return Err(self.error("control character found while parsing a string", at(k)));
            }
            let s = core::str::from_utf8(body)
                .map_err(|e| self.error("invalid unicode code point", at(e.valid_up_to())))?;
            return Ok(Some((self.b.text(s), end)));
        }
        let mut out = core::mem::take(&mut self.scratch);
        out.clear();
        let mut k = 0;
        while k < body.len() {
            let run = body[k..]
                .iter()
                .position(|&c| c == b'\\' || c < 0x20)
                .map_or(body.len(), |n| k + n);
            let s = core::str::from_utf8(&body[k..run])
                .map_err(|e| self.error("invalid unicode code point", at(k + e.valid_up_to())))?;
            out.push_str(s);
            k = run;
            if k == body.len() {
                break;
            }
            if body[k] < 0x20 {
                self.scratch = out;
                return Err(self.error("control character found while parsing a string", at(k)));
            }
            let esc = body.get(k + 1).copied().unwrap_or(0);
            k += 2;
            let ch = match esc {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let hex = |k: usize| {
                        body.get(k..k + 4)
                            .and_then(|h| core::str::from_utf8(h).ok())
                            .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))
                            .and_then(|h| u32::from_str_radix(h, 16).ok())
                    };
                    let Some(first) = hex(k) else {
                        self.scratch = out;
                        return Err(self.error("invalid escape", at(k)));
                    };
                    k += 4;
                    let code = if (0xD800..0xDC00).contains(&first) {
                        // A leading surrogate needs a trailing one, escaped right after it.
                        let second = (body.get(k..k + 2) == Some(b"\\u"))
                            .then(|| hex(k + 2))
                            .flatten()
                            .filter(|s| (0xDC00..0xE000).contains(s));
                        let Some(second) = second else {
                            self.scratch = out;
                            return Err(self.error("lone leading surrogate in hex escape", at(k)));
                        };
                        k += 6;
                        0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                    } else {
                        first
                    };
                    match char::from_u32(code) {
                        Some(ch) => ch,
                        None => {
                            self.scratch = out;
                            return Err(self.error("lone trailing surrogate in hex escape", at(k)));
                        }
                    }
                }
                _ => {
                    self.scratch = out;
                    return Err(self.error("invalid escape", at(k - 1)));
                }
            };
            out.push(ch);
        }
        let v = self.b.text(&out);
        self.scratch = out;
        Ok(Some((v, end)))
    }

    /// The number token at `t[i]`, as a value, and where it ends; `None` while it may go on.
    fn number(
        &mut self,
        t: &[u8],
        i: usize,
        at_end: bool,
    ) -> Result<Option<(Value, usize)>, JsonError> {
        let Some(end) = self.scan(t, i, at_end, |s, from| {
            let k = from
                + s[from..]
                    .iter()
                    .position(|c| !matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .unwrap_or(s.len() - from);
            // At the end of the text a number ends with it.
            if k < s.len() || at_end {
                Scan::Complete(k)
            } else {
                Scan::Cut(k)
            }
        })?
        else {
            return Ok(None);
        };
        let s = &t[i..end];
        // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
        let digits = |k: usize| s[k..].iter().take_while(|c| c.is_ascii_digit()).count();
        let neg = s[0] == b'-';
        let mut k = usize::from(neg);
        let int_digits = digits(k);
        if int_digits == 0 || (s[k] == b'0' && int_digits > 1) {
            return Err(self.error("invalid number", i + k));
        }
        k += int_digits;
        let mut float = false;
        if s.get(k) == Some(&b'.') {
            let n = digits(k + 1);
            if n == 0 {
                return Err(self.error("invalid number", i + k + 1));
            }
            k += 1 + n;
            float = true;
        }
        if matches!(s.get(k), Some(b'e' | b'E')) {
            k += 1;
            if matches!(s.get(k), Some(b'+' | b'-')) {
                k += 1;
            }
            let n = digits(k);
            if n == 0 {
                return Err(self.error("invalid number", i + k));
            }
            k += n;
            float = true;
        }
        if k != s.len() {
            return Err(self.error("invalid number", i + k));
        }
        // ASCII only, so valid UTF-8.
        let text = core::str::from_utf8(s).unwrap_or("");
        let magnitude = (!float)
            .then(|| text[usize::from(neg)..].parse::<u64>().ok())
            .flatten();
        let numbers = &mut self.b.p.numbers;
        let v = match (neg, magnitude) {
            (false, Some(u)) => match i64::try_from(u) {
                Ok(v) => int_value(numbers, v),
                Err(_) => Value::BigInt,
            },
            // -0 is a float, as serde_json reads it; down to i64::MIN an integer.
            (true, Some(u)) if u > 0 && u <= 1 << 63 => {
                int_value(numbers, (u as i64).wrapping_neg())
            }
            _ => match text.parse::<f64>() {
                Ok(f) if f.is_finite() => float_value(numbers, f),
                _ => return Err(self.error("number out of range", i)),
            },
        };
        Ok(Some((v, end)))
    }
}
