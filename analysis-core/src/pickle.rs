//! A data-only pickle reader (protocols 2 to 5, the subset `pickle.dump` writes for dicts,
//! lists, tuples, strings, bytes, numbers, booleans and None), for PyTorch memory snapshots.
//!
//! It never executes anything: opcodes that name or build Python objects (`GLOBAL`, `REDUCE`,
//! `BUILD`, `NEWOBJ`, persistent ids, …) are refused with an error naming the opcode. Memory is
//! bounded by the input: every opcode creates at most one node in an arena, memo references copy
//! an index (so shared or even cyclic structures cost nothing extra), and no length prefix is
//! trusted beyond the bytes present.

use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;

/// A value: scalars inline, containers as indexes into the arena of a [`Pickle`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer that does not fit in 64 bits.
    BigInt,
    Float(f64),
    Str(u32),
    Bytes(u32),
    List(u32),
    Tuple(u32),
    Dict(u32),
}

/// A decoded pickle: the root value and the arena it points into.
#[derive(Debug, Default)]
pub struct Pickle {
    pub root: Option<Value>,
    strings: Vec<String>,
    bytes: Vec<Vec<u8>>,
    seqs: Vec<Vec<Value>>,
    dicts: Vec<Vec<(Value, Value)>>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    #[error("the pickle ends early (at byte {offset}): the file is truncated")]
    Truncated { offset: usize },
    #[error(
        "the pickle uses opcode 0x{opcode:02x} at byte {offset}, which builds Python objects; \
         gpucollect only reads plain data and never executes pickles"
    )]
    Unsupported { opcode: u8, offset: usize },
    #[error("the pickle is malformed at byte {offset}: {what}")]
    Malformed { offset: usize, what: &'static str },
    #[error("this is not a pickle (it does not start with the PROTO opcode 0x80)")]
    NotAPickle,
}

/// Opcodes (see CPython's Lib/pickletools.py for the reference descriptions).
mod op {
    pub const PROTO: u8 = 0x80;
    pub const FRAME: u8 = 0x95;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const NONE: u8 = b'N';
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINFLOAT: u8 = b'G';
    pub const BINUNICODE: u8 = b'X';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_LIST: u8 = b']';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPEND: u8 = b'a';
    pub const APPENDS: u8 = b'e';
    pub const LIST: u8 = b'l';
    pub const TUPLE: u8 = b't';
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const DICT: u8 = b'd';
    pub const SETITEM: u8 = b's';
    pub const SETITEMS: u8 = b'u';
    pub const MEMOIZE: u8 = 0x94;
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
}

/// Stack entries: a value or a MARK.
#[derive(Clone, Copy)]
enum Slot {
    Mark,
    Val(Value),
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(PickleError::Truncated { offset: self.pos })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn le<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn len_u64(&mut self) -> Result<usize, PickleError> {
        usize::try_from(u64::from_le_bytes(self.le()?))
            .map_err(|_| PickleError::Truncated { offset: self.pos })
    }
}

impl Pickle {
    /// Parses a whole pickle.
    pub fn parse(input: &[u8]) -> Result<Self, PickleError> {
        if input.first() != Some(&op::PROTO) {
            return Err(PickleError::NotAPickle);
        }
        let mut p = Pickle::default();
        let mut c = Cursor { b: input, pos: 0 };
        let mut stack: Vec<Slot> = Vec::new();
        // Memo keys are almost always sequential (MEMOIZE): a vector, with a map for the rest.
        let mut memo: Vec<Value> = Vec::new();
        let mut sparse_memo: HashMap<u32, Value> = HashMap::new();
        let malformed = |offset, what| PickleError::Malformed { offset, what };
        loop {
            let at = c.pos;
            let code = c.u8()?;
            let pop = |stack: &mut Vec<Slot>| match stack.pop() {
                Some(Slot::Val(v)) => Ok(v),
                _ => Err(malformed(
                    at,
                    "an opcode needs a value the stack does not have",
                )),
            };
            // Values since the topmost MARK (removing the mark).
            let pop_mark = |stack: &mut Vec<Slot>| -> Result<Vec<Value>, PickleError> {
                let m = stack
                    .iter()
                    .rposition(|s| matches!(s, Slot::Mark))
                    .ok_or(malformed(at, "no MARK on the stack"))?;
                let items = stack[m + 1..]
                    .iter()
                    .filter_map(|s| match s {
                        Slot::Val(v) => Some(*v),
                        Slot::Mark => None,
                    })
                    .collect();
                stack.truncate(m);
                Ok(items)
            };
            let v = match code {
                op::PROTO => {
                    let proto = c.u8()?;
                    if !(2..=5).contains(&proto) {
                        return Err(malformed(at, "pickle protocol outside 2 to 5"));
                    }
                    continue;
                }
                op::FRAME => {
                    c.take(8)?;
                    continue;
                }
                op::STOP => {
                    p.root = Some(pop(&mut stack)?);
                    return Ok(p);
                }
                op::MARK => {
                    stack.push(Slot::Mark);
                    continue;
                }
                op::POP => {
                    stack.pop().ok_or(malformed(at, "POP on an empty stack"))?;
                    continue;
                }
                op::POP_MARK => {
                    pop_mark(&mut stack)?;
                    continue;
                }
                op::DUP => {
                    let top = *stack.last().ok_or(malformed(at, "DUP on an empty stack"))?;
                    stack.push(top);
                    continue;
                }
                op::NONE => Value::None,
                op::NEWTRUE => Value::Bool(true),
                op::NEWFALSE => Value::Bool(false),
                op::BININT => Value::Int(i64::from(i32::from_le_bytes(c.le()?))),
                op::BININT1 => Value::Int(i64::from(c.u8()?)),
                op::BININT2 => Value::Int(i64::from(u16::from_le_bytes(c.le()?))),
                op::LONG1 | op::LONG4 => {
                    let n = if code == op::LONG1 {
                        usize::from(c.u8()?)
                    } else {
                        u32::from_le_bytes(c.le()?) as usize
                    };
                    let b = c.take(n)?;
                    if n == 0 {
                        Value::Int(0)
                    } else if n <= 8 {
                        // Little-endian two's complement, sign-extended.
                        let fill = if b[n - 1] & 0x80 != 0 { 0xff } else { 0 };
                        let mut a = [fill; 8];
                        a[..n].copy_from_slice(b);
                        Value::Int(i64::from_le_bytes(a))
                    } else {
                        Value::BigInt
                    }
                }
                op::BINFLOAT => Value::Float(f64::from_be_bytes(c.le()?)),
                op::BINUNICODE | op::SHORT_BINUNICODE | op::BINUNICODE8 => {
                    let n = match code {
                        op::SHORT_BINUNICODE => usize::from(c.u8()?),
                        op::BINUNICODE => u32::from_le_bytes(c.le()?) as usize,
                        _ => c.len_u64()?,
                    };
                    let s = core::str::from_utf8(c.take(n)?)
                        .map_err(|_| malformed(at, "a string that is not UTF-8"))?;
                    p.strings.push(String::from(s));
                    Value::Str((p.strings.len() - 1) as u32)
                }
                op::BINBYTES | op::SHORT_BINBYTES | op::BINBYTES8 => {
                    let n = match code {
                        op::SHORT_BINBYTES => usize::from(c.u8()?),
                        op::BINBYTES => u32::from_le_bytes(c.le()?) as usize,
                        _ => c.len_u64()?,
                    };
                    p.bytes.push(c.take(n)?.to_vec());
                    Value::Bytes((p.bytes.len() - 1) as u32)
                }
                op::EMPTY_LIST => {
                    p.seqs.push(Vec::new());
                    Value::List((p.seqs.len() - 1) as u32)
                }
                op::EMPTY_TUPLE => {
                    p.seqs.push(Vec::new());
                    Value::Tuple((p.seqs.len() - 1) as u32)
                }
                op::EMPTY_DICT => {
                    p.dicts.push(Vec::new());
                    Value::Dict((p.dicts.len() - 1) as u32)
                }
                op::LIST | op::TUPLE => {
                    let items = pop_mark(&mut stack)?;
                    p.seqs.push(items);
                    let i = (p.seqs.len() - 1) as u32;
                    if code == op::LIST {
                        Value::List(i)
                    } else {
                        Value::Tuple(i)
                    }
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1 + 1);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(pop(&mut stack)?);
                    }
                    items.reverse();
                    p.seqs.push(items);
                    Value::Tuple((p.seqs.len() - 1) as u32)
                }
                op::DICT => {
                    let items = pop_mark(&mut stack)?;
                    if items.len() % 2 != 0 {
                        return Err(malformed(at, "DICT with an odd number of items"));
                    }
                    p.dicts
                        .push(items.chunks(2).map(|kv| (kv[0], kv[1])).collect());
                    Value::Dict((p.dicts.len() - 1) as u32)
                }
                op::APPEND | op::APPENDS => {
                    let items = if code == op::APPEND {
                        alloc::vec![pop(&mut stack)?]
                    } else {
                        pop_mark(&mut stack)?
                    };
                    match stack.last() {
                        Some(Slot::Val(Value::List(i))) => p.seqs[*i as usize].extend(items),
                        _ => return Err(malformed(at, "APPEND to something that is not a list")),
                    }
                    continue;
                }
                op::SETITEM | op::SETITEMS => {
                    let items = if code == op::SETITEM {
                        let v = pop(&mut stack)?;
                        let k = pop(&mut stack)?;
                        alloc::vec![k, v]
                    } else {
                        pop_mark(&mut stack)?
                    };
                    if items.len() % 2 != 0 {
                        return Err(malformed(at, "SETITEMS with an odd number of items"));
                    }
                    match stack.last() {
                        Some(Slot::Val(Value::Dict(i))) => {
                            p.dicts[*i as usize].extend(items.chunks(2).map(|kv| (kv[0], kv[1])))
                        }
                        _ => return Err(malformed(at, "SETITEM on something that is not a dict")),
                    }
                    continue;
                }
                op::MEMOIZE | op::BINPUT | op::LONG_BINPUT => {
                    let key = match code {
                        op::MEMOIZE => (memo.len() + sparse_memo.len()) as u32,
                        op::BINPUT => u32::from(c.u8()?),
                        _ => u32::from_le_bytes(c.le()?),
                    };
                    let v = match stack.last() {
                        Some(Slot::Val(v)) => *v,
                        _ => return Err(malformed(at, "MEMOIZE without a value")),
                    };
                    let k = key as usize;
                    if k == memo.len() {
                        memo.push(v);
                    } else if k < memo.len() {
                        memo[k] = v;
                    } else {
                        sparse_memo.insert(key, v);
                    }
                    continue;
                }
                op::BINGET | op::LONG_BINGET => {
                    let key = if code == op::BINGET {
                        u32::from(c.u8()?)
                    } else {
                        u32::from_le_bytes(c.le()?)
                    };
                    *memo
                        .get(key as usize)
                        .or_else(|| sparse_memo.get(&key))
                        .ok_or(malformed(at, "a memo reference to nothing"))?
                }
                other => {
                    return Err(PickleError::Unsupported {
                        opcode: other,
                        offset: at,
                    });
                }
            };
            stack.push(Slot::Val(v));
        }
    }

    pub fn str(&self, v: Value) -> Option<&str> {
        match v {
            Value::Str(i) => self.strings.get(i as usize).map(String::as_str),
            _ => None,
        }
    }

    pub fn bytes(&self, v: Value) -> Option<&[u8]> {
        match v {
            Value::Bytes(i) => self.bytes.get(i as usize).map(Vec::as_slice),
            _ => None,
        }
    }

    /// Items of a list or tuple (empty for anything else).
    pub fn items(&self, v: Value) -> &[Value] {
        match v {
            Value::List(i) | Value::Tuple(i) => {
                self.seqs.get(i as usize).map_or(&[], Vec::as_slice)
            }
            _ => &[],
        }
    }

    /// Entries of a dict (empty for anything else).
    pub fn entries(&self, v: Value) -> &[(Value, Value)] {
        match v {
            Value::Dict(i) => self.dicts.get(i as usize).map_or(&[], Vec::as_slice),
            _ => &[],
        }
    }

    /// The value under a string key of a dict (the last one wins, as in Python).
    pub fn get(&self, dict: Value, key: &str) -> Option<Value> {
        self.entries(dict)
            .iter()
            .rev()
            .find(|(k, _)| self.str(*k) == Some(key))
            .map(|(_, v)| *v)
    }

    pub fn int(&self, v: Option<Value>) -> Option<i64> {
        match v? {
            Value::Int(i) => Some(i),
            Value::Float(f) if f.is_finite() => Some(f as i64),
            Value::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    pub fn float(&self, v: Option<Value>) -> Option<f64> {
        match v? {
            Value::Int(i) => Some(i as f64),
            Value::Float(f) => Some(f),
            _ => None,
        }
    }

    /// Builds an arena from JSON (the same data PyTorch's viewer accepts as JSON).
    pub fn from_json(v: &serde_json::Value) -> Self {
        let mut p = Pickle::default();
        let root = p.add_json(v, 0);
        p.root = Some(root);
        p
    }

    fn add_json(&mut self, v: &serde_json::Value, depth: usize) -> Value {
        use serde_json::Value as J;
        if depth > 256 {
            return Value::None;
        }
        match v {
            J::Null => Value::None,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => match n.as_u64() {
                    Some(_) => Value::BigInt,
                    None => Value::Float(n.as_f64().unwrap_or(0.0)),
                },
            },
            J::String(s) => {
                self.strings.push(s.clone());
                Value::Str((self.strings.len() - 1) as u32)
            }
            J::Array(a) => {
                let items: Vec<Value> = a.iter().map(|x| self.add_json(x, depth + 1)).collect();
                self.seqs.push(items);
                Value::List((self.seqs.len() - 1) as u32)
            }
            J::Object(o) => {
                let mut entries = Vec::with_capacity(o.len());
                for (k, x) in o {
                    self.strings.push(k.clone());
                    let key = Value::Str((self.strings.len() - 1) as u32);
                    entries.push((key, self.add_json(x, depth + 1)));
                }
                self.dicts.push(entries);
                Value::Dict((self.dicts.len() - 1) as u32)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pickle.dumps({'a': [1, -2, 3.5, 'x', None, True], 'b': (300, 70000, 2**40)}, protocol=4)`
    /// with CPython 3.11.
    const SAMPLE: &[u8] = b"\x80\x04\x959\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xffG@\x0c\x00\x00\x00\x00\x00\x00\x8c\x01x\x94N\x88e\x8c\x01b\x94M,\x01Jp\x11\x01\x00\x8a\x06\x00\x00\x00\x00\x00\x01\x87\x94u.";

    #[test]
    fn reads_what_cpython_writes() {
        let p = Pickle::parse(SAMPLE).expect("parses");
        let root = p.root.expect("root");
        let a = p.get(root, "a").expect("a");
        let items = p.items(a);
        assert_eq!(items.len(), 6);
        assert_eq!(items[0], Value::Int(1));
        assert_eq!(items[1], Value::Int(-2));
        assert_eq!(items[2], Value::Float(3.5));
        assert_eq!(p.str(items[3]), Some("x"));
        assert_eq!(items[4], Value::None);
        assert_eq!(items[5], Value::Bool(true));
        let b = p.items(p.get(root, "b").expect("b")).to_vec();
        assert_eq!(
            b,
            alloc::vec![Value::Int(300), Value::Int(70000), Value::Int(1 << 40)]
        );
    }

    #[test]
    fn truncation_and_code_are_errors() {
        for cut in 1..SAMPLE.len() {
            assert!(Pickle::parse(&SAMPLE[..cut]).is_err(), "cut at {cut}");
        }
        // `pickle.dumps(os.system, protocol=4)`: a GLOBAL reference is refused, never resolved.
        let global = b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.";
        assert!(matches!(
            Pickle::parse(global),
            Err(PickleError::Unsupported { opcode: 0x93, .. })
        ));
        assert_eq!(Pickle::parse(b"{}").err(), Some(PickleError::NotAPickle));
        // A huge length prefix allocates nothing.
        let huge = b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7fabc";
        assert!(matches!(
            Pickle::parse(huge),
            Err(PickleError::Truncated { .. })
        ));
    }
}
