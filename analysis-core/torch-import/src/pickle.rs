//! A data-only pickle reader (protocols 2 to 5, the subset `pickle.dump` writes for dicts,
//! lists, tuples, strings, bytes, numbers, booleans and None), for PyTorch memory snapshots.
//!
//! It never executes anything: opcodes that name or build Python objects (`GLOBAL`, `REDUCE`,
//! `BUILD`, `NEWOBJ`, persistent ids, …) are refused with an error naming the opcode. Memory is
//! bounded by the input: every opcode creates at most one node in an arena, memo references copy
//! an index (so shared or even cyclic structures cost nothing extra), no length prefix is
//! trusted beyond the bytes present, and a pickle whose values take more than
//! [`PARSE_HEAP_PER_INPUT_BYTE`] bytes of heap per byte (plus [`PARSE_HEAP_FREE`]) is refused
//! ([`PickleError::TooDense`]; the JSON reader does the same).
//!
//! [`Parser`] reads a whole input or one that arrives in pieces (an opcode cut by the end of the
//! input so far is rerun once the rest is there), with the same result. Pieces are dropped once
//! parsed: only the strings are kept (copied out; PyTorch memoizes them, so there are few), so
//! the parser's memory does not include the input's size. The dicts PyTorch writes
//! for every trace entry and frame take a fast path with exactly the generic opcodes' effect.

use alloc::borrow::Cow;
use alloc::vec::Vec;
use hashbrown::HashMap;

use core::hash::Hasher;

use crate::int_hash::{IntHasher, IntMap};

mod json;
pub use json::{JsonError, JsonParser};

/// What a [`Value`] is (match on [`Pickle::kind`]): numbers and flags, strings and containers
/// as indexes into the arena of a [`Pickle`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
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

/// A value ([`Pickle::kind`] says what it is), made with the constructors named like the kinds
/// (`Value::Int(3)`, `Value::None`).
///
/// Eight bytes: a 4-bit tag and 60 bits of payload (an integer within ±2^59, a flag, or an
/// index). Floats and larger integers sit in the pickle's table of numbers, the payload being
/// their index ([`Pickle::kind`] reads them). A 1M-entry snapshot memoizes and lists millions of
/// values, and every page of memory they take is a page fault the first time it is written;
/// two 8-byte scalars before this were 16 bytes. One integer, not an enum with payloads of
/// several types: such an enum is copied through memory, written piecewise and read back whole
/// (a store-forwarding stall on every opcode).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value(u64);

#[allow(non_upper_case_globals, non_snake_case)]
impl Value {
    const NONE: u64 = 0;
    const BOOL: u64 = 1;
    const INT: u64 = 2;
    /// An integer beyond ±2^59, in the table of numbers.
    const WIDE_INT: u64 = 3;
    const BIG_INT: u64 = 4;
    /// A float, in the table of numbers.
    const FLOAT: u64 = 5;
    const STR: u64 = 6;
    const BYTES: u64 = 7;
    const LIST: u64 = 8;
    const TUPLE: u64 = 9;
    const DICT: u64 = 10;
    const PAYLOAD_BITS: u32 = 60;
    const PAYLOAD: u64 = (1 << Self::PAYLOAD_BITS) - 1;

    #[inline(always)]
    const fn new(tag: u64, payload: u64) -> Value {
        Value(tag << Self::PAYLOAD_BITS | (payload & Self::PAYLOAD))
    }
    #[inline(always)]
    const fn tag(self) -> u64 {
        self.0 >> Self::PAYLOAD_BITS
    }
    #[inline(always)]
    const fn index(self) -> u32 {
        self.0 as u32
    }
    /// Not a container (a list, tuple or dict).
    #[inline(always)]
    const fn is_scalar(self) -> bool {
        self.tag() < Self::LIST
    }

    pub const None: Value = Value::new(Self::NONE, 0);
    /// An integer that does not fit in 64 bits.
    pub const BigInt: Value = Value::new(Self::BIG_INT, 0);
    #[inline(always)]
    pub const fn Bool(b: bool) -> Value {
        Value::new(Self::BOOL, b as u64)
    }
    /// An integer within ±2^59 ([`Value::fits`]); the parser keeps larger ones in its table
    /// of numbers. Larger ones given here become [`Value::BigInt`].
    #[inline(always)]
    pub const fn Int(i: i64) -> Value {
        if Self::fits(i) {
            Value::new(Self::INT, i as u64)
        } else {
            Self::BigInt
        }
    }
    /// Whether `i` fits in a value's payload.
    #[inline(always)]
    pub const fn fits(i: i64) -> bool {
        Self::sign_extend(i as u64) == i
    }
    /// The payload's low 60 bits as a signed integer.
    #[inline(always)]
    const fn sign_extend(bits: u64) -> i64 {
        let shift = 64 - Self::PAYLOAD_BITS;
        ((bits << shift) as i64) >> shift
    }
    #[inline(always)]
    pub const fn Str(i: u32) -> Value {
        Value::new(Self::STR, i as u64)
    }
    #[inline(always)]
    pub const fn Bytes(i: u32) -> Value {
        Value::new(Self::BYTES, i as u64)
    }
    #[inline(always)]
    pub const fn List(i: u32) -> Value {
        Value::new(Self::LIST, i as u64)
    }
    #[inline(always)]
    pub const fn Tuple(i: u32) -> Value {
        Value::new(Self::TUPLE, i as u64)
    }
    #[inline(always)]
    pub const fn Dict(i: u32) -> Value {
        Value::new(Self::DICT, i as u64)
    }

    /// The integer of a value made by [`Value::Int`] (sign-extended payload).
    #[inline(always)]
    const fn small_int(self) -> i64 {
        Self::sign_extend(self.0)
    }

    /// The string index of a string.
    #[inline(always)]
    pub const fn as_str(self) -> Option<u32> {
        match self.tag() {
            Self::STR => Some(self.index()),
            _ => Option::None,
        }
    }

    /// The sequence index of a list or tuple.
    #[inline(always)]
    pub const fn as_seq(self) -> Option<u32> {
        match self.tag() {
            Self::LIST | Self::TUPLE => Some(self.index()),
            _ => Option::None,
        }
    }

    /// The dict index of a dict.
    #[inline(always)]
    pub const fn as_dict(self) -> Option<u32> {
        match self.tag() {
            Self::DICT => Some(self.index()),
            _ => Option::None,
        }
    }

    /// The index of a list (to append to).
    #[inline(always)]
    const fn as_list(self) -> Option<u32> {
        match self.tag() {
            Self::LIST => Some(self.index()),
            _ => Option::None,
        }
    }
}

impl core::fmt::Debug for Value {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let i = self.index();
        match self.tag() {
            Self::BOOL => write!(f, "Bool({})", self.0 & 1 != 0),
            Self::INT => write!(f, "Int({})", self.small_int()),
            Self::WIDE_INT => write!(f, "WideInt(#{i})"),
            Self::BIG_INT => write!(f, "BigInt"),
            Self::FLOAT => write!(f, "Float(#{i})"),
            Self::STR => write!(f, "Str({i})"),
            Self::BYTES => write!(f, "Bytes({i})"),
            Self::LIST => write!(f, "List({i})"),
            Self::TUPLE => write!(f, "Tuple({i})"),
            Self::DICT => write!(f, "Dict({i})"),
            _ => write!(f, "None"),
        }
    }
}

/// An integer as a value: inline when it fits, else in `numbers`.
#[inline(always)]
fn int_value(numbers: &mut Vec<u64>, i: i64) -> Value {
    if Value::fits(i) {
        Value::Int(i)
    } else {
        numbers.push(i as u64);
        Value::new(Value::WIDE_INT, (numbers.len() - 1) as u64)
    }
}

/// A float as a value (in `numbers`).
#[inline(always)]
fn float_value(numbers: &mut Vec<u64>, f: f64) -> Value {
    numbers.push(f.to_bits());
    Value::new(Value::FLOAT, (numbers.len() - 1) as u64)
}

/// A hash of a list's items: four lanes, each a chain of multiplies over every fourth item
/// (one chain over all of them would wait for each multiply in turn; frames lists have dozens
/// of items).
fn items_hash(items: &[Value]) -> u64 {
    let [mut a, mut b, mut c, mut d] = <[IntHasher; 4]>::default();
    let quads = items.chunks_exact(4);
    for v in quads.remainder() {
        a.write_u64(v.0);
    }
    for q in quads {
        a.write_u64(q[0].0);
        b.write_u64(q[1].0);
        c.write_u64(q[2].0);
        d.write_u64(q[3].0);
    }
    let mut h = IntHasher::default();
    for lane in [a, b, c, d] {
        h.write_u64(lane.finish());
    }
    h.finish()
}

/// Where a container's items are: a range of the shared flat arena while the container grows
/// at its end (the usual case: one `SETITEMS`/`APPENDS` right after the values), or a vector of
/// its own once it grows after something else was added (long lists pickled in batches).
#[derive(Clone, Copy, Debug)]
enum Items {
    Flat {
        start: u32,
        len: u32,
    },
    Own(u32),
    /// A dict a [`Pickle::parse_with`] callback took: it keeps only this tag (and items set later).
    Taken(u32),
}

/// The strings and byte strings of a pickle, copied out of its input one after the other.
#[derive(Debug, Default)]
struct Texts {
    bytes: Vec<u8>,
    /// (start, length) in `bytes` of each.
    spans: Vec<(u32, u32)>,
}

impl Texts {
    /// Adds a string; its index. The bytes of all strings are at most the input's, which is
    /// under 4 GiB ([`PickleError::TooLarge`]).
    #[inline(always)]
    fn add(&mut self, s: &[u8]) -> u32 {
        self.spans.push((self.bytes.len() as u32, s.len() as u32));
        self.bytes.extend_from_slice(s);
        (self.spans.len() - 1) as u32
    }

    fn get(&self, i: u32) -> &[u8] {
        self.spans
            .get(i as usize)
            .and_then(|&(start, len)| {
                self.bytes
                    .get(start as usize..(start as usize + len as usize))
            })
            .unwrap_or(&[])
    }
}

/// Containers of one kind (sequences or dicts) in one flat arena.
#[derive(Debug)]
struct Arena<T> {
    heads: Vec<Items>,
    flat: Vec<T>,
    own: Vec<Vec<T>>,
    /// Items in `own`, all vectors together (for [`Arena::heap_bytes`]).
    own_items: usize,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Self {
            heads: Vec::new(),
            flat: Vec::new(),
            own: Vec::new(),
            own_items: 0,
        }
    }
}

impl<T: Copy> Arena<T> {
    /// A new empty container (`EMPTY_LIST`, `EMPTY_DICT`: two per trace entry).
    #[inline(always)]
    fn new_empty(&mut self) -> u32 {
        self.heads.push(Items::Flat {
            start: self.flat.len() as u32,
            len: 0,
        });
        (self.heads.len() - 1) as u32
    }

    fn new_container(&mut self, items: impl Iterator<Item = T>) -> u32 {
        let start = self.flat.len() as u32;
        self.flat.extend(items);
        let len = self.flat.len() as u32 - start;
        self.heads.push(Items::Flat { start, len });
        (self.heads.len() - 1) as u32
    }

    fn extend(&mut self, i: u32, items: impl Iterator<Item = T>) {
        let Some(head) = self.heads.get_mut(i as usize) else {
            return;
        };
        match *head {
            Items::Flat { start, len } if len == 0 || (start + len) as usize == self.flat.len() => {
                let start = if len == 0 {
                    self.flat.len() as u32
                } else {
                    start
                };
                self.flat.extend(items);
                *head = Items::Flat {
                    start,
                    len: self.flat.len() as u32 - start,
                };
            }
            Items::Flat { start, len } => {
                let mut own = self.flat[start as usize..(start + len) as usize].to_vec();
                own.extend(items);
                self.own_items += own.len();
                self.own.push(own);
                *head = Items::Own((self.own.len() - 1) as u32);
            }
            Items::Own(k) => {
                let own = &mut self.own[k as usize];
                let before = own.len();
                own.extend(items);
                self.own_items += own.len() - before;
            }
            Items::Taken(_) => {
                let start = self.flat.len() as u32;
                self.flat.extend(items);
                *head = Items::Flat {
                    start,
                    len: self.flat.len() as u32 - start,
                };
            }
        }
    }

    fn new_taken(&mut self, tag: u32) -> u32 {
        self.heads.push(Items::Taken(tag));
        (self.heads.len() - 1) as u32
    }

    fn set_taken(&mut self, i: u32, tag: u32) {
        if let Some(head) = self.heads.get_mut(i as usize) {
            *head = Items::Taken(tag);
        }
    }

    fn is_empty(&self, i: u32) -> bool {
        matches!(self.heads.get(i as usize), Some(Items::Flat { len: 0, .. }))
    }

    fn taken(&self, i: u32) -> Option<u32> {
        match self.heads.get(i as usize) {
            Some(&Items::Taken(tag)) => Some(tag),
            _ => None,
        }
    }

    /// Heap bytes held (vectors' capacities; items of own vectors by their number).
    fn heap_bytes(&self) -> usize {
        use core::mem::size_of;
        self.heads.capacity() * size_of::<Items>()
            + self.flat.capacity() * size_of::<T>()
            + self.own.capacity() * size_of::<Vec<T>>()
            + self.own_items * size_of::<T>()
    }

    fn get(&self, i: u32) -> &[T] {
        match self.heads.get(i as usize) {
            Some(&Items::Flat { start, len }) => &self.flat[start as usize..(start + len) as usize],
            Some(&Items::Own(k)) => &self.own[k as usize],
            Some(Items::Taken(_)) | None => &[],
        }
    }
}

/// A decoded pickle: the root value and the arena it points into. Strings and bytes are spans
/// of one buffer, so reading one allocates nothing.
#[derive(Debug, Default)]
pub struct Pickle {
    pub root: Option<Value>,
    texts: Texts,
    /// Floats and integers beyond a value's payload, as bits.
    numbers: Vec<u64>,
    seqs: Arena<Value>,
    dicts: Arena<(Value, Value)>,
    /// The flat range of each distinct list content filled so far, by a hash of its items
    /// ([`Pickle::fill_list`]).
    shared: IntMap<u64, (u32, u32)>,
    /// The same for lists of memo references, by their bytes ([`RefLists`]); parse-time only.
    ref_lists: RefLists,
}

/// The most bytes of memo-reference lists [`RefLists`] keeps (the distinct ones: a few KiB
/// in real snapshots); past it, lists not seen yet are only parsed.
const REF_LIST_BYTES_MAX: usize = 16 << 20;

/// The flat ranges of lists made only of memo references (`MARK (BINGET | LONG_BINGET)*
/// APPENDS`: PyTorch's frames lists, which point at frame dicts pickled once), by the bytes of
/// those references. A list whose bytes equal an earlier one's has the same items, as long as
/// no memo key they use was bound again in between (which clears this), so it takes that
/// list's range without looking its references up, pushing them or hashing its items.
#[derive(Debug, Default)]
struct RefLists {
    /// By a hash of the bytes: where they are in `bytes`, and the list's flat range.
    by_hash: IntMap<u64, RefList>,
    bytes: Vec<u8>,
}

#[derive(Clone, Copy, Debug)]
struct RefList {
    at: u32,
    len: u32,
    start: u32,
    items: u32,
}

/// A hash of a memo-reference list's bytes for [`RefLists`]: its length and three of its 8-byte
/// words (first, middle, last), enough to tell the lists of a snapshot apart (lists whose
/// sampled words agree are still compared in full: a collision only costs a lookup).
#[inline(always)]
fn refs_hash(b: &[u8]) -> u64 {
    let word = |at: usize| {
        b.get(at..at + 8)
            .and_then(|w| w.first_chunk::<8>())
            .map_or(0, |w| u64::from_le_bytes(*w))
    };
    let mut h = IntHasher::default();
    h.write_usize(b.len());
    if b.len() < 8 {
        let mut a = [0u8; 8];
        a[..b.len()].copy_from_slice(b);
        h.write_u64(u64::from_le_bytes(a));
    } else {
        let last = b.len() - 8;
        h.write_u64(word(0));
        h.write_u64(word(last / 2));
        h.write_u64(word(last));
    }
    h.finish()
}

/// Whether two byte strings are equal, compared a word at a time without a branch per word
/// (WebAssembly's `memcmp` goes byte by byte).
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut a, mut b) = (a, b);
    let mut diff = 0;
    while let (Some((x, rest_a)), Some((y, rest_b))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        diff |= u64::from_le_bytes(*x) ^ u64::from_le_bytes(*y);
        (a, b) = (rest_a, rest_b);
    }
    let rest = a.iter().zip(b).fold(0, |acc, (x, y)| acc | (x ^ y));
    diff == 0 && rest == 0
}

impl RefLists {
    /// The flat range of the list with these reference bytes, if one was recorded.
    #[inline(always)]
    fn get(&self, refs: &[u8]) -> Option<(u32, u32)> {
        let r = self.by_hash.get(&refs_hash(refs))?;
        let kept = self.bytes.get(r.at as usize..(r.at + r.len) as usize)?;
        same_bytes(kept, refs).then_some((r.start, r.items))
    }

    fn insert(&mut self, refs: &[u8], start: u32, items: u32) {
        if self.bytes.len() + refs.len() > REF_LIST_BYTES_MAX {
            return;
        }
        let at = self.bytes.len() as u32;
        self.by_hash.entry(refs_hash(refs)).or_insert_with(|| {
            self.bytes.extend_from_slice(refs);
            RefList {
                at,
                len: refs.len() as u32,
                start,
                items,
            }
        });
    }

    /// Forgets every list: a memo key was bound again, so equal bytes may not mean equal items.
    fn clear(&mut self) {
        if !self.by_hash.is_empty() {
            self.by_hash.clear();
            self.bytes.clear();
        }
    }
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
    #[error("the pickle is larger than 4 GiB, more than gpucollect reads at once")]
    TooLarge,
    /// Decided on the tables' capacities, which only grow, against a limit fixed by the size
    /// hint where that is the input's size: so whole or in pieces, a pickle gives this or not
    /// alike, as far as both grow their tables alike (the same opcodes run; a vector grown by
    /// one `extend` rather than item by item could end with another capacity).
    #[error(
        "the pickle packs more values into its bytes than gpucollect reads: its values took \
         more than 4 bytes of memory per byte of pickle (plus 32 MiB), where a PyTorch \
         snapshot takes about one; refused, so that memory stays proportional to the file"
    )]
    TooDense,
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

/// The pickle machine's state between batches of opcodes: everything but the input and the
/// arena, which are the [`Pickle`]'s.
#[derive(Debug)]
struct Vm {
    /// Where the next opcode starts.
    pos: usize,
    /// Where the opcode being run started: when the input so far ends inside it, the machine
    /// rewinds to here and runs it again once more bytes are there.
    at: usize,
    /// The value stack, and where each MARK sits in it (as CPython keeps them).
    stack: Vec<Value>,
    marks: Vec<usize>,
    /// Memo keys are almost always sequential (MEMOIZE): a vector, with a map for the rest.
    memo: Vec<Value>,
    sparse_memo: HashMap<u32, Value>,
    /// Whether dicts take the fast path ([`dict_items`]); off only in tests that compare.
    fast_dicts: bool,
}

/// Stores `v` under the next MEMOIZE key, as CPython numbers them (the memo's size).
#[inline(always)]
fn memoize(memo: &mut Vec<Value>, sparse_memo: &mut HashMap<u32, Value>, v: Value) {
    if sparse_memo.is_empty() {
        memo.push(v);
    } else {
        let key = (memo.len() + sparse_memo.len()) as u32;
        sparse_memo.insert(key, v);
    }
}

/// A little-endian two's complement integer of up to 8 bytes, sign-extended (LONG1's operand).
/// `rest` starts at the integer's first byte and may go on past its `n` bytes.
#[inline(always)]
fn long_le(rest: &[u8], n: usize) -> i64 {
    if n == 0 {
        return 0;
    }
    if let Some(&word) = rest.first_chunk::<8>() {
        // One load and two shifts instead of a variable-length copy.
        let shift = 64 - 8 * n as u32;
        return ((u64::from_le_bytes(word) << shift) as i64) >> shift;
    }
    let b = &rest[..n];
    let fill = if b[n - 1] & 0x80 != 0 { 0xff } else { 0 };
    let mut a = [fill; 8];
    a[..n].copy_from_slice(b);
    i64::from_le_bytes(a)
}

/// Runs one value opcode of the kinds dict items are made of (and a MEMOIZE right after it),
/// exactly as the generic machine would; false, with nothing done, for any other opcode or one
/// whose operands are not all there yet.
#[inline(always)]
fn dict_item(
    c: &mut Cursor<'_>,
    p: &mut Pickle,
    stack: &mut Vec<Value>,
    marks: &mut Vec<usize>,
    memo: &mut Vec<Value>,
    sparse_memo: &mut HashMap<u32, Value>,
) -> bool {
    let b = c.b;
    let pos = c.pos;
    let Some(&code) = b.get(pos) else {
        return false;
    };
    let arg = |n: usize| b.get(pos + 1..pos + 1 + n);
    // Pushes the value, skips its `len` bytes and the MEMOIZE after it, if any.
    macro_rules! emit {
        ($v:expr, $len:expr) => {{
            let v = $v;
            stack.push(v);
            c.pos = pos + $len;
            if b.get(c.pos) == Some(&op::MEMOIZE) {
                memoize(memo, sparse_memo, v);
                c.pos += 1;
            }
            true
        }};
    }
    match code {
        op::BINGET => match arg(1).and_then(|k| memo.get(usize::from(k[0]))) {
            Some(&v) => emit!(v, 2),
            None => false,
        },
        op::LONG_BINGET => match arg(4)
            .and_then(|k| k.first_chunk::<4>())
            .and_then(|k| memo.get(u32::from_le_bytes(*k) as usize))
        {
            Some(&v) => emit!(v, 5),
            None => false,
        },
        op::BININT1 => match arg(1) {
            Some(k) => emit!(Value::Int(i64::from(k[0])), 2),
            None => false,
        },
        op::BININT2 => match arg(2).and_then(|k| k.first_chunk::<2>()) {
            Some(k) => emit!(Value::Int(i64::from(u16::from_le_bytes(*k))), 3),
            None => false,
        },
        op::BININT => match arg(4).and_then(|k| k.first_chunk::<4>()) {
            Some(k) => emit!(Value::Int(i64::from(i32::from_le_bytes(*k))), 5),
            None => false,
        },
        op::LONG1 => {
            let Some(n) = arg(1).map(|k| usize::from(k[0])) else {
                return false;
            };
            if b.len() < pos + 2 + n {
                return false;
            }
            if n <= 8 {
                emit!(int_value(&mut p.numbers, long_le(&b[pos + 2..], n)), 2 + n)
            } else {
                emit!(Value::BigInt, 2 + n)
            }
        }
        op::SHORT_BINUNICODE => {
            let Some(n) = arg(1).map(|k| usize::from(k[0])) else {
                return false;
            };
            match b.get(pos + 2..pos + 2 + n) {
                Some(s) if core::str::from_utf8(s).is_ok() => {
                    emit!(Value::Str(p.texts.add(s)), 2 + n)
                }
                _ => false,
            }
        }
        op::NONE => emit!(Value::None, 1),
        op::NEWTRUE => emit!(Value::Bool(true), 1),
        op::NEWFALSE => emit!(Value::Bool(false), 1),
        op::BINFLOAT => match arg(8).and_then(|k| k.first_chunk::<8>()) {
            Some(k) => emit!(float_value(&mut p.numbers, f64::from_be_bytes(*k)), 9),
            None => false,
        },
        op::EMPTY_LIST => {
            let list = p.seqs.new_empty();
            emit!(Value::List(list), 1);
            list_of_memo_refs(c, p, stack, marks, memo, list)
        }
        _ => false,
    }
}

/// Right after an empty list (and its MEMOIZE): fills it from `MARK (BINGET | LONG_BINGET)*
/// APPENDS` (PyTorch's frames lists), exactly as the generic machine would. False once it
/// meets anything else; the opcodes run by then have had their effect, as in [`dict_item`].
#[inline(always)]
fn list_of_memo_refs(
    c: &mut Cursor<'_>,
    p: &mut Pickle,
    stack: &mut Vec<Value>,
    marks: &mut Vec<usize>,
    memo: &[Value],
    list: u32,
) -> bool {
    let b = c.b;
    if b.get(c.pos) != Some(&op::MARK) {
        return false;
    }
    let first = c.pos + 1;
    // Where the references end: at an APPENDS that closes them, their bytes key the list.
    let mut end = first;
    loop {
        match b.get(end) {
            Some(&op::LONG_BINGET) => end += 5,
            Some(&op::BINGET) => end += 2,
            _ => break,
        }
    }
    let refs = match b.get(end) {
        Some(&op::APPENDS) if end > first => Some(&b[first..end]),
        _ => None,
    };
    if let Some((start, len)) = refs.and_then(|r| p.ref_lists.get(r)) {
        // The generic machine's MARK, lookups and APPENDS would give these items.
        p.seqs.heads[list as usize] = Items::Flat { start, len };
        c.pos = end + 1;
        return true;
    }
    let m = stack.len();
    marks.push(m);
    c.pos = first;
    memo_refs(c, stack, memo);
    if b.get(c.pos) != Some(&op::APPENDS) {
        return false;
    }
    let resolved = c.pos == end;
    c.pos += 1;
    marks.pop();
    p.fill_list(list, &stack[m..]);
    stack.truncate(m);
    // Every reference was in the dense memo, so the same bytes give the same items until a
    // key is bound again.
    if let (true, Some(refs), Some(&Items::Flat { start, len })) =
        (resolved, refs, p.seqs.heads.get(list as usize))
    {
        p.ref_lists.insert(refs, start, len);
    }
    true
}

/// The fast path for the dicts PyTorch writes for every trace entry and frame, run right after
/// their `EMPTY_DICT`: `MEMOIZE? MARK (key MEMOIZE? value MEMOIZE?)*`, keys and values being
/// memo references, numbers, short strings or empty lists. It stops before the first opcode it
/// does not handle (the closing `SETITEMS`, a nested list's MARK, anything unusual) or whose
/// operands are not all there yet. Every opcode it runs has exactly the generic machine's
/// effect on the stack, the marks, the memo and the arena, so the machine goes on from there as
/// if it had run them one by one; only the dispatch is cheaper (one well-predicted branch per
/// position instead of the generic `match` for each opcode).
#[inline(always)]
fn dict_items(
    c: &mut Cursor<'_>,
    p: &mut Pickle,
    stack: &mut Vec<Value>,
    marks: &mut Vec<usize>,
    memo: &mut Vec<Value>,
    sparse_memo: &mut HashMap<u32, Value>,
) {
    let b = c.b;
    if b.get(c.pos) == Some(&op::MEMOIZE) {
        let Some(&dict) = stack.last() else { return };
        memoize(memo, sparse_memo, dict);
        c.pos += 1;
    }
    if b.get(c.pos) != Some(&op::MARK) {
        return;
    }
    marks.push(stack.len());
    c.pos += 1;
    while dict_item(c, p, stack, marks, memo, sparse_memo)
        && dict_item(c, p, stack, marks, memo, sparse_memo)
    {}
}

/// Pushes the memo references that follow a MARK (the items of PyTorch's frames lists), as the
/// generic machine would, stopping before anything else.
#[inline(always)]
fn memo_refs(c: &mut Cursor<'_>, stack: &mut Vec<Value>, memo: &[Value]) {
    let b = c.b;
    let mut pos = c.pos;
    loop {
        let v = match b.get(pos) {
            Some(&op::LONG_BINGET) => match b.get(pos + 1..pos + 5) {
                Some(k) => match memo.get(u32::from_le_bytes([k[0], k[1], k[2], k[3]]) as usize) {
                    Some(&v) => {
                        pos += 5;
                        v
                    }
                    None => break,
                },
                None => break,
            },
            Some(&op::BINGET) => match b.get(pos + 1).and_then(|&k| memo.get(usize::from(k))) {
                Some(&v) => {
                    pos += 2;
                    v
                }
                None => break,
            },
            _ => break,
        };
        stack.push(v);
    }
    c.pos = pos;
}

impl Vm {
    /// Heap bytes held by the stacks and the memo.
    fn heap_bytes(&self) -> usize {
        use core::mem::size_of;
        self.stack.capacity() * size_of::<Value>()
            + self.marks.capacity() * size_of::<usize>()
            + self.memo.capacity() * size_of::<Value>()
            + self.sparse_memo.capacity() * (size_of::<(u32, Value)>() + 1)
    }

    fn new(fast_dicts: bool) -> Self {
        Self {
            pos: 0,
            at: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Vec::new(),
            sparse_memo: HashMap::new(),
            fast_dicts,
        }
    }

    /// Runs up to `budget` opcodes of `input` (dicts on the fast path count as one) from `pos`
    /// (`pos` and `at` are offsets in `input`, the input not yet dropped); the root
    /// value once STOP is reached. The work is cut into calls like this so a WebAssembly engine
    /// that compiles hot functions in the background (V8's dynamic tiering) switches to the
    /// optimized code after the first few batches, instead of running one long call in its
    /// baseline code. On an error, `at` is where the failing opcode starts.
    #[inline(never)]
    fn run(
        &mut self,
        input: &[u8],
        p: &mut Pickle,
        take: &mut impl FnMut(&Pickle, &[Value]) -> Option<u32>,
        budget: usize,
    ) -> Result<Option<Value>, PickleError> {
        let Vm {
            pos,
            at: at_slot,
            stack,
            marks,
            memo,
            sparse_memo,
            fast_dicts,
        } = self;
        let mut c = Cursor {
            b: input,
            pos: *pos,
        };
        let c = &mut c;
        let malformed = |offset, what| PickleError::Malformed { offset, what };
        for _ in 0..budget {
            let at = c.pos;
            *at_slot = at;
            let code = c.u8()?;
            let floor = marks.last().copied().unwrap_or(0);
            let pop = |stack: &mut Vec<Value>| {
                if stack.len() > floor {
                    stack.pop().ok_or(malformed(at, ""))
                } else {
                    Err(malformed(
                        at,
                        "an opcode needs a value the stack does not have",
                    ))
                }
            };
            // Where the values since the topmost MARK start (removing the mark).
            let pop_mark =
                |marks: &mut Vec<usize>| marks.pop().ok_or(malformed(at, "no MARK on the stack"));
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
                    let root = pop(stack)?;
                    *pos = c.pos;
                    return Ok(Some(root));
                }
                op::MARK => {
                    marks.push(stack.len());
                    if *fast_dicts {
                        memo_refs(c, stack, memo);
                    }
                    continue;
                }
                op::POP => {
                    if stack.len() > floor {
                        stack.pop();
                    } else {
                        // The top of the stack is a MARK.
                        marks.pop().ok_or(malformed(at, "POP on an empty stack"))?;
                    }
                    continue;
                }
                op::POP_MARK => {
                    let m = pop_mark(marks)?;
                    stack.truncate(m);
                    continue;
                }
                op::DUP => {
                    let top = pop(stack)?;
                    stack.push(top);
                    top
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
                    let start = c.pos;
                    c.take(n)?;
                    if n <= 8 {
                        int_value(&mut p.numbers, long_le(&c.b[start..], n))
                    } else {
                        Value::BigInt
                    }
                }
                op::BINFLOAT => float_value(&mut p.numbers, f64::from_be_bytes(c.le()?)),
                op::BINUNICODE | op::SHORT_BINUNICODE | op::BINUNICODE8 => {
                    let n = match code {
                        op::SHORT_BINUNICODE => usize::from(c.u8()?),
                        op::BINUNICODE => u32::from_le_bytes(c.le()?) as usize,
                        _ => c.len_u64()?,
                    };
                    let s = c.take(n)?;
                    if core::str::from_utf8(s).is_err() {
                        return Err(malformed(at, "a string that is not UTF-8"));
                    }
                    Value::Str(p.texts.add(s))
                }
                op::BINBYTES | op::SHORT_BINBYTES | op::BINBYTES8 => {
                    let n = match code {
                        op::SHORT_BINBYTES => usize::from(c.u8()?),
                        op::BINBYTES => u32::from_le_bytes(c.le()?) as usize,
                        _ => c.len_u64()?,
                    };
                    Value::Bytes(p.texts.add(c.take(n)?))
                }
                op::EMPTY_LIST => Value::List(p.seqs.new_empty()),
                op::EMPTY_TUPLE => Value::Tuple(p.seqs.new_empty()),
                op::EMPTY_DICT => {
                    stack.push(Value::Dict(p.dicts.new_empty()));
                    if *fast_dicts {
                        dict_items(c, p, stack, marks, memo, sparse_memo);
                    }
                    continue;
                }
                op::LIST | op::TUPLE => {
                    let m = pop_mark(marks)?;
                    let i = p.seqs.new_container(stack[m..].iter().copied());
                    stack.truncate(m);
                    if code == op::LIST {
                        Value::List(i)
                    } else {
                        Value::Tuple(i)
                    }
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1 + 1);
                    if stack.len() < floor + n {
                        return Err(malformed(
                            at,
                            "an opcode needs a value the stack does not have",
                        ));
                    }
                    let m = stack.len() - n;
                    let i = p.seqs.new_container(stack[m..].iter().copied());
                    stack.truncate(m);
                    Value::Tuple(i)
                }
                op::DICT => {
                    let m = pop_mark(marks)?;
                    let items = &stack[m..];
                    if !items.len().is_multiple_of(2) {
                        return Err(malformed(at, "DICT with an odd number of items"));
                    }
                    let i = match take(p, items) {
                        Some(tag) => p.dicts.new_taken(tag),
                        None => p
                            .dicts
                            .new_container(items.chunks_exact(2).map(|kv| (kv[0], kv[1]))),
                    };
                    stack.truncate(m);
                    Value::Dict(i)
                }
                op::APPEND | op::APPENDS => {
                    let m = if code == op::APPEND {
                        if stack.len() <= floor {
                            return Err(malformed(
                                at,
                                "an opcode needs a value the stack does not have",
                            ));
                        }
                        stack.len() - 1
                    } else {
                        pop_mark(marks)?
                    };
                    match m.checked_sub(1).and_then(|t| stack.get(t)?.as_list()) {
                        Some(i) if p.seqs.is_empty(i) => p.fill_list(i, &stack[m..]),
                        Some(i) => p.seqs.extend(i, stack[m..].iter().copied()),
                        None => {
                            return Err(malformed(at, "APPEND to something that is not a list"));
                        }
                    }
                    stack.truncate(m);
                    continue;
                }
                op::SETITEM | op::SETITEMS => {
                    let m = if code == op::SETITEM {
                        if stack.len() < floor + 2 {
                            return Err(malformed(
                                at,
                                "an opcode needs a value the stack does not have",
                            ));
                        }
                        stack.len() - 2
                    } else {
                        pop_mark(marks)?
                    };
                    if !(stack.len() - m).is_multiple_of(2) {
                        return Err(malformed(at, "SETITEMS with an odd number of items"));
                    }
                    match m.checked_sub(1).and_then(|t| stack.get(t)?.as_dict()) {
                        Some(i) => {
                            let tag = if p.dicts.is_empty(i) {
                                take(p, &stack[m..])
                            } else {
                                None
                            };
                            match tag {
                                Some(tag) => p.dicts.set_taken(i, tag),
                                None => p
                                    .dicts
                                    .extend(i, stack[m..].chunks_exact(2).map(|kv| (kv[0], kv[1]))),
                            }
                        }
                        None => {
                            return Err(malformed(at, "SETITEM on something that is not a dict"));
                        }
                    }
                    stack.truncate(m);
                    continue;
                }
                op::MEMOIZE | op::BINPUT | op::LONG_BINPUT => {
                    let key = match code {
                        op::MEMOIZE => (memo.len() + sparse_memo.len()) as u32,
                        op::BINPUT => u32::from(c.u8()?),
                        _ => u32::from_le_bytes(c.le()?),
                    };
                    let v = match stack.last() {
                        Some(v) if stack.len() > floor => *v,
                        _ => return Err(malformed(at, "MEMOIZE without a value")),
                    };
                    let k = key as usize;
                    if k == memo.len() {
                        memo.push(v);
                    } else if k < memo.len() {
                        memo[k] = v;
                        p.ref_lists.clear();
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
            stack.push(v);
        }
        *pos = c.pos;
        Ok(None)
    }
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

/// Opcodes run per [`Vm::run`] call.
const BATCH_OPCODES: usize = 1 << 14;

/// The heap a [`Parser`] may hold per byte of input (the larger of the bytes parsed and the
/// size hint), beyond [`PARSE_HEAP_FREE`]: checked after every batch of opcodes, so it holds
/// within a batch's growth. PyTorch snapshots take about one byte per byte (the tables
/// reserved from the hint, see `Parser::with_input`); a pickle of one-byte values (`None`,
/// empty lists), 8 bytes each in the arena and again on the stack, would take 16 and more.
pub const PARSE_HEAP_PER_INPUT_BYTE: usize = 4;
/// The heap any pickle may take while parsed (see [`PARSE_HEAP_PER_INPUT_BYTE`]).
pub const PARSE_HEAP_FREE: usize = 32 << 20;

/// A pickle being parsed, from a whole input or from pieces as they arrive.
///
/// [`Parser::advance`] runs every opcode whose bytes are all there; an opcode cut by the end of
/// the input so far is run again from its start once [`Parser::push`] brings the rest, so
/// the result never depends on how the input was cut. Nothing is trusted beyond the bytes
/// present, and a truncated pickle is an error only when `advance` is told the input ended.
/// Pushed input is dropped once parsed (the next push reuses its buffer), so memory grows with
/// the pickle's values, not with its size.
#[derive(Debug)]
pub struct Parser<'a> {
    p: Pickle,
    vm: Vm,
    /// The input not parsed yet (and the opcode being rerun): all of it, borrowed, for
    /// [`Parser::new`]; the pieces pushed, from the first byte not dropped, otherwise.
    input: Cow<'a, [u8]>,
    /// Where `input` starts in the whole (errors give offsets in the whole).
    base: usize,
    /// The size hint (or the whole input's size), for the heap limit.
    hint: usize,
    done: bool,
}

impl<'a> Parser<'a> {
    /// A parser over a whole input, borrowed (nothing is copied but strings).
    pub fn new(input: &'a [u8]) -> Result<Self, PickleError> {
        if u32::try_from(input.len()).is_err() {
            return Err(PickleError::TooLarge);
        }
        Ok(Self::with_input(Cow::Borrowed(input), input.len()))
    }

    /// A parser for input pushed in pieces, about `size_hint_bytes` in all (the hint only
    /// sizes the tables that grow with the input).
    pub fn incremental(size_hint_bytes: usize) -> Parser<'static> {
        let hint = size_hint_bytes.min(u32::MAX as usize);
        Parser::with_input(Cow::Owned(Vec::new()), hint)
    }

    fn with_input(input: Cow<'a, [u8]>, hint: usize) -> Self {
        // Sized for PyTorch snapshots, so that nothing is copied as it grows (costly in
        // WebAssembly, where realloc copies): up to about one list item per 40 bytes (the
        // device traces, the annotations), one item of a dict not taken (annotations, blocks,
        // frames), one dict and one memoized value per 48 (real snapshots memoize more than
        // synthetic ones), one list per 160 (real snapshots have a frames list per trace
        // entry, about 200 bytes). Untouched reserve costs address space, not time.
        Self {
            p: Pickle {
                texts: Texts {
                    bytes: Vec::with_capacity(hint / 256),
                    spans: Vec::with_capacity(hint / 1024),
                },
                numbers: Vec::new(),
                seqs: Arena {
                    heads: Vec::with_capacity(hint / 160),
                    flat: Vec::with_capacity(hint / 40),
                    own: Vec::new(),
                    own_items: 0,
                },
                dicts: Arena {
                    heads: Vec::with_capacity(hint / 48),
                    flat: Vec::with_capacity(hint / 48),
                    own: Vec::new(),
                    own_items: 0,
                },
                shared: IntMap::default(),
                ref_lists: RefLists::default(),
                root: None,
            },
            vm: Vm {
                memo: Vec::with_capacity(hint / 48),
                stack: Vec::with_capacity(64),
                ..Vm::new(true)
            },
            input,
            base: 0,
            hint,
            done: false,
        }
    }

    /// Refuses to go on once the tables hold more than [`PARSE_HEAP_PER_INPUT_BYTE`] bytes per
    /// byte of input (parsed, or hinted) plus [`PARSE_HEAP_FREE`].
    fn check_heap(&self) -> Result<(), PickleError> {
        let parsed = self.base + self.vm.pos;
        let limit = PARSE_HEAP_PER_INPUT_BYTE
            .saturating_mul(parsed.max(self.hint))
            .saturating_add(PARSE_HEAP_FREE);
        if self.p.heap_bytes() + self.vm.heap_bytes() > limit {
            return Err(PickleError::TooDense);
        }
        Ok(())
    }

    /// Turns the fast path for dicts off (tests compare it with the generic machine).
    #[cfg(test)]
    fn generic_only(mut self) -> Self {
        self.vm.fast_dicts = false;
        self
    }

    /// Appends a piece of input (copying it; the input of [`Parser::new`] is copied here
    /// the first time).
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), PickleError> {
        self.push_with(chunk.len(), |to| to.copy_from_slice(chunk))
    }

    /// Appends `len` bytes that `fill` writes in place (straight from where the caller has
    /// them, e.g. a browser's buffer, without a copy in between), like [`Parser::push`].
    pub fn push_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), PickleError> {
        let total = (self.base + self.input.len()).checked_add(len);
        if total.is_none_or(|n| u32::try_from(n).is_err()) {
            return Err(PickleError::TooLarge);
        }
        if !self.done {
            self.drop_parsed();
            let input = self.input.to_mut();
            let start = input.len();
            input.resize(start + len, 0);
            fill(&mut input[start..]);
        }
        Ok(())
    }

    /// Drops the input parsed so far from a buffer of pushed pieces; an opcode to be rerun
    /// moves to the front (a few bytes: the buffer is reused for the next piece).
    fn drop_parsed(&mut self) {
        let parsed = self.vm.at.min(self.vm.pos);
        if let Cow::Owned(input) = &mut self.input
            && parsed > 0
        {
            input.drain(..parsed);
            self.base += parsed;
            self.vm.pos -= parsed;
            self.vm.at -= parsed;
        }
    }

    /// Runs every opcode whose bytes are all there, offering dicts to `take` as
    /// [`Pickle::parse_with`] does. Returns whether the pickle is complete (STOP was reached).
    /// `at_end` says no more input will come: then an opcode cut short is an error
    /// ([`PickleError::Truncated`]), else it waits for more.
    pub fn advance(
        &mut self,
        take: &mut impl FnMut(&Pickle, &[Value]) -> Option<u32>,
        at_end: bool,
    ) -> Result<bool, PickleError> {
        if self.done {
            return Ok(true);
        }
        match self.input.first() {
            Some(&op::PROTO) if self.base == 0 => {}
            _ if self.base > 0 => {}
            None if !at_end => return Ok(false),
            _ => return Err(PickleError::NotAPickle),
        }
        loop {
            let ran = self.vm.run(&self.input, &mut self.p, take, BATCH_OPCODES);
            self.check_heap()?;
            match ran {
                Ok(Some(root)) => {
                    self.p.root = Some(root);
                    self.done = true;
                    self.p.ref_lists = RefLists::default();
                    self.input = Cow::Owned(Vec::new());
                    return Ok(true);
                }
                Ok(None) => {}
                Err(PickleError::Truncated { .. }) if !at_end => {
                    // Every opcode (and the fast path) reads all its operands before it changes
                    // anything, so the machine is as it was before the cut opcode: rerun it
                    // from its start once more input is there.
                    self.vm.pos = self.vm.at;
                    self.drop_parsed();
                    return Ok(false);
                }
                Err(e) => return Err(e.shifted(self.base)),
            }
        }
    }

    /// The pickle so far (complete once [`Parser::advance`] returned true).
    pub fn pickle(&self) -> &Pickle {
        &self.p
    }

    /// The pickle (its `root` is `None` unless [`Parser::advance`] returned true).
    pub fn into_pickle(self) -> Pickle {
        self.p
    }
}

impl PickleError {
    /// The error with its offset moved by `base` (from a piece of the input to the whole).
    fn shifted(self, base: usize) -> Self {
        match self {
            Self::Truncated { offset } => Self::Truncated {
                offset: offset + base,
            },
            Self::Unsupported { opcode, offset } => Self::Unsupported {
                opcode,
                offset: offset + base,
            },
            Self::Malformed { offset, what } => Self::Malformed {
                offset: offset + base,
                what,
            },
            other => other,
        }
    }
}

impl Pickle {
    /// Heap bytes held by the arena and the parse-time tables (capacities).
    fn heap_bytes(&self) -> usize {
        use core::mem::size_of;
        self.texts.bytes.capacity()
            + self.texts.spans.capacity() * size_of::<(u32, u32)>()
            + self.numbers.capacity() * size_of::<u64>()
            + self.seqs.heap_bytes()
            + self.dicts.heap_bytes()
            + self.shared.capacity() * (size_of::<(u64, (u32, u32))>() + 1)
            + self.ref_lists.bytes.capacity()
            + self.ref_lists.by_hash.capacity() * (size_of::<(u64, RefList)>() + 1)
    }

    /// Parses a whole pickle.
    pub fn parse(input: &[u8]) -> Result<Self, PickleError> {
        Self::parse_with(input, |_, _| None)
    }

    /// Parses a whole pickle, offering each dict to `take` when its first items are set (as
    /// keys and values alternating). A dict `take` answers `Some(tag)` for is not stored: it
    /// keeps only the tag, which [`Pickle::taken`] returns. This lets a reader turn millions of
    /// small records into its own compact form while they are parsed, instead of keeping them
    /// all as generic dicts.
    pub fn parse_with(
        input: &[u8],
        mut take: impl FnMut(&Pickle, &[Value]) -> Option<u32>,
    ) -> Result<Self, PickleError> {
        let mut parser = Parser::new(input)?;
        parser.advance(&mut take, true)?;
        Ok(parser.into_pickle())
    }

    fn span(&self, i: u32) -> &[u8] {
        self.texts.get(i)
    }
    pub fn str(&self, v: Value) -> Option<&str> {
        core::str::from_utf8(self.span(v.as_str()?)).ok()
    }

    pub fn bytes(&self, v: Value) -> Option<&[u8]> {
        match v.tag() {
            Value::BYTES => Some(self.span(v.index())),
            _ => None,
        }
    }

    /// What a value is.
    pub fn kind(&self, v: Value) -> Kind {
        let i = v.index();
        let number = || self.numbers.get(i as usize).copied().unwrap_or(0);
        match v.tag() {
            Value::BOOL => Kind::Bool(v.0 & 1 != 0),
            Value::INT => Kind::Int(v.small_int()),
            Value::WIDE_INT => Kind::Int(number() as i64),
            Value::BIG_INT => Kind::BigInt,
            Value::FLOAT => Kind::Float(f64::from_bits(number())),
            Value::STR => Kind::Str(i),
            Value::BYTES => Kind::Bytes(i),
            Value::LIST => Kind::List(i),
            Value::TUPLE => Kind::Tuple(i),
            Value::DICT => Kind::Dict(i),
            _ => Kind::None,
        }
    }

    /// Items of a list or tuple (empty for anything else).
    pub fn items(&self, v: Value) -> &[Value] {
        match v.as_seq() {
            Some(i) => self.seqs.get(i),
            None => &[],
        }
    }

    /// Where a list's or tuple's items are, as a key: two sequences with the same key have the
    /// same items (lists that share items, `Pickle::fill_list`, have the same key), so a
    /// reader can cache what it makes of them by it.
    pub fn items_key(&self, v: Value) -> Option<(u32, u32)> {
        match self.seqs.heads.get(v.as_seq()? as usize)? {
            &Items::Flat { start, len } => Some((start, len)),
            // Flat lengths stay below u32::MAX: the input, under 4 GiB, has a byte per item.
            &Items::Own(k) => Some((k, u32::MAX)),
            Items::Taken(_) => None,
        }
    }

    /// The tag of a dict the [`Pickle::parse_with`] callback took.
    pub fn taken(&self, v: Value) -> Option<u32> {
        self.dicts.taken(v.as_dict()?)
    }

    /// Entries of a dict (empty for anything else, and for a dict the callback took).
    pub fn entries(&self, v: Value) -> &[(Value, Value)] {
        match v.as_dict() {
            Some(i) => self.dicts.get(i),
            None => &[],
        }
    }

    /// The value under a string key of a dict (the last one wins, as in Python).
    pub fn get(&self, dict: Value, key: &str) -> Option<Value> {
        self.entries(dict)
            .iter()
            .rev()
            .find(|(k, _)| k.as_str().is_some_and(|i| self.span(i) == key.as_bytes()))
            .map(|(_, v)| *v)
    }

    #[inline]
    pub fn int(&self, v: Option<Value>) -> Option<i64> {
        let v = v?;
        if v.tag() == Value::INT {
            return Some(v.small_int());
        }
        self.other_int(v)
    }

    #[cold]
    fn other_int(&self, v: Value) -> Option<i64> {
        match self.kind(v) {
            Kind::Int(i) => Some(i),
            Kind::Float(f) if f.is_finite() => Some(f as i64),
            Kind::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    pub fn float(&self, v: Option<Value>) -> Option<f64> {
        match self.kind(v?) {
            Kind::Int(i) => Some(i as f64),
            Kind::Float(f) => Some(f),
            _ => None,
        }
    }

    /// Fills the empty list `i` with `items`, or lets it share the items of an earlier list
    /// with the same items instead of keeping a copy. Real snapshots give every trace entry a
    /// frames list of its own, but of few distinct contents (a training loop allocates from
    /// the same call paths step after step): `real-torch.pickle` has 30 distinct lists for
    /// 1,667 entries. Without this, their items are most of the memory a real snapshot takes.
    /// Nothing can tell a shared list from a copy: ranges of the flat arena never change (a
    /// list grows in place only past its end, and one that shares an earlier range moves to a
    /// vector of its own when it grows).
    fn fill_list(&mut self, i: u32, items: &[Value]) {
        if items.is_empty() {
            return;
        }
        let hash = items_hash(items);
        if let Some(&(s, n)) = self.shared.get(&hash) {
            // Without a branch per item (they almost always match).
            let shared = &self.seqs.flat[s as usize..(s + n) as usize];
            if shared.len() == items.len()
                && shared
                    .iter()
                    .zip(items)
                    .fold(0, |acc, (x, y)| acc | (x.0 ^ y.0))
                    == 0
            {
                self.seqs.heads[i as usize] = Items::Flat { start: s, len: n };
                return;
            }
        }
        self.seqs.extend(i, items.iter().copied());
        if let Some(&Items::Flat { start, len }) = self.seqs.heads.get(i as usize) {
            self.shared.entry(hash).or_insert((start, len));
        }
    }

    /// Builds an arena from JSON text (the same data PyTorch's viewer accepts as JSON), straight
    /// from the text: no tree of JSON values in between, and each distinct string stored once
    /// (JSON has no memo, so a snapshot repeats its keys and frame strings in every entry).
    /// Nesting deeper than 128 is an error. [`JsonParser`] does the same from pieces.
    pub fn from_json(text: &[u8]) -> Result<Pickle, JsonError> {
        let mut parser = JsonParser::new();
        parser.push(text)?;
        parser.finish()
    }

    fn add_text(&mut self, s: &str) -> Value {
        let fits = (self.texts.bytes.len() as u64 + s.len() as u64) <= u64::from(u32::MAX);
        if !fits {
            return Value::None;
        }
        Value::Str(self.texts.add(s.as_bytes()))
    }
}

/// What [`JsonParser`] builds with: the arena, its strings by content, its small dicts of
/// scalars by content, and the items of the lists and dicts being read (nested ones above their
/// parents'), reused from one container to the next.
struct JsonBuilder {
    p: Pickle,
    strings: HashMap<alloc::boxed::Box<str>, Value>,
    /// Dicts of at most [`JsonBuilder::SHARED_DICT_PAIRS`] pairs, every key and value a scalar
    /// (a frame: file, line, function), by their pairs in order. JSON has no memo, so a snapshot
    /// repeats its frames in every entry; made once, they make equal `frames` lists equal
    /// items, which the arena then shares ([`Pickle::fill_list`]) and the conversion converts
    /// once, as it does for a pickle's memoized frames.
    dicts: HashMap<alloc::boxed::Box<[(Value, Value)]>, u32>,
    items: Vec<Value>,
    pairs: Vec<(Value, Value)>,
}

impl JsonBuilder {
    const SHARED_DICT_PAIRS: usize = 8;

    /// Heap bytes held: the arena, the tables of distinct strings and frames (their keys
    /// counted as the arena's copies of the strings, and up to the most pairs), the stacks.
    fn heap_bytes(&self) -> usize {
        use core::mem::size_of;
        self.p.heap_bytes()
            + self.p.texts.bytes.len()
            + self.strings.capacity() * (size_of::<(alloc::boxed::Box<str>, Value)>() + 1)
            + self.dicts.capacity()
                * (size_of::<(alloc::boxed::Box<[(Value, Value)]>, u32)>()
                    + 1
                    + Self::SHARED_DICT_PAIRS * size_of::<(Value, Value)>())
            + self.items.capacity() * size_of::<Value>()
            + self.pairs.capacity() * size_of::<(Value, Value)>()
    }

    fn new() -> Self {
        JsonBuilder {
            p: Pickle::default(),
            strings: HashMap::new(),
            dicts: HashMap::new(),
            items: Vec::new(),
            pairs: Vec::new(),
        }
    }

    /// The list of `items[start..]`, the items taken off.
    fn list(&mut self, start: usize) -> Value {
        let i = self.p.seqs.new_empty();
        self.p.fill_list(i, &self.items[start..]);
        self.items.truncate(start);
        Value::List(i)
    }
    /// Distinct dicts kept for sharing: annotations are dicts of scalars too, nearly all
    /// distinct, so the table is capped (a dict past it is simply made anew).
    const SHARED_DICTS: usize = 1 << 18;

    /// The dict of `pairs[start..]`, made or found, the pairs taken off.
    fn dict(&mut self, start: usize) -> Value {
        let pairs = &self.pairs[start..];
        let shareable = pairs.len() <= Self::SHARED_DICT_PAIRS
            && pairs.iter().all(|(k, v)| k.is_scalar() && v.is_scalar());
        if !shareable {
            return Value::Dict(self.p.dicts.new_container(self.pairs.drain(start..)));
        }
        if let Some(&d) = self.dicts.get(pairs) {
            self.pairs.truncate(start);
            return Value::Dict(d);
        }
        let key = (self.dicts.len() < Self::SHARED_DICTS)
            .then(|| alloc::boxed::Box::<[(Value, Value)]>::from(pairs));
        let d = self.p.dicts.new_container(self.pairs.drain(start..));
        if let Some(key) = key {
            self.dicts.insert(key, d);
        }
        Value::Dict(d)
    }

    fn text(&mut self, s: &str) -> Value {
        if let Some(&v) = self.strings.get(s) {
            return v;
        }
        let v = self.p.add_text(s);
        self.strings.insert(s.into(), v);
        v
    }
}

/// The same arena built through serde_json, which read snapshots' JSON before [`JsonParser`]:
/// the tests' reference.
#[cfg(test)]
fn from_json_serde(text: &[u8]) -> Result<Pickle, serde_json::Error> {
    use serde::de::DeserializeSeed;
    let mut b = JsonBuilder::new();
    let mut de = serde_json::Deserializer::from_slice(text);
    let root = JsonValue(&mut b).deserialize(&mut de)?;
    de.end()?;
    b.p.root = Some(root);
    Ok(b.p)
}

/// One JSON value, added to the arena (the tests' reference).
#[cfg(test)]
struct JsonValue<'b>(&'b mut JsonBuilder);

#[cfg(test)]
impl<'de> serde::de::DeserializeSeed<'de> for JsonValue<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

#[cfg(test)]
impl<'de> serde::de::Visitor<'de> for JsonValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::None)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::None)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        Ok(int_value(&mut self.0.p.numbers, i))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        Ok(match i64::try_from(u) {
            Ok(i) => int_value(&mut self.0.p.numbers, i),
            Err(_) => Value::BigInt,
        })
    }

    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        Ok(float_value(&mut self.0.p.numbers, f))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(self.0.text(s))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let b = self.0;
        let start = b.items.len();
        while let Some(v) = seq.next_element_seed(JsonValue(b))? {
            b.items.push(v);
        }
        Ok(b.list(start))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let b = self.0;
        let start = b.pairs.len();
        while let Some(k) = map.next_key_seed(JsonValue(b))? {
            let v = map.next_value_seed(JsonValue(b))?;
            b.pairs.push((k, v));
        }
        Ok(b.dict(start))
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
        assert_eq!(p.float(Some(items[2])), Some(3.5));
        assert_eq!(p.kind(items[2]), Kind::Float(3.5));
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
    fn integers_beyond_a_values_payload_and_floats_keep_every_bit() {
        // `pickle.dumps([2**62, -2**62 - 5, 2**63 - 1, -2**63, 2**59 - 1, 0.1], protocol=2)`,
        // written by hand: LONG1 with 8 bytes, then BINFLOAT.
        let mut b = alloc::vec![0x80, 2, b']', b'('];
        for i in [
            1i64 << 62,
            -(1 << 62) - 5,
            i64::MAX,
            i64::MIN,
            (1 << 59) - 1,
        ] {
            b.extend([op::LONG1, 8]);
            b.extend(i.to_le_bytes());
        }
        b.push(op::BINFLOAT);
        b.extend(0.1f64.to_be_bytes());
        b.extend([b'e', b'.']);
        let p = Pickle::parse(&b).expect("parses");
        let items = p.items(p.root.expect("root"));
        let ints: Vec<Option<i64>> = items[..5].iter().map(|v| p.int(Some(*v))).collect();
        assert_eq!(
            ints,
            [
                1i64 << 62,
                -(1 << 62) - 5,
                i64::MAX,
                i64::MIN,
                (1 << 59) - 1
            ]
            .map(Some)
        );
        assert_eq!(items[4], Value::Int((1 << 59) - 1), "fits inline");
        assert_eq!(p.kind(items[2]), Kind::Int(i64::MAX));
        assert_eq!(p.float(Some(items[5])), Some(0.1));
        assert_eq!(
            Value::Int(1 << 60),
            Value::BigInt,
            "too wide to make without a pickle"
        );
        // The same numbers from JSON.
        let p =
            Pickle::from_json(b"[4611686018427387904, -9223372036854775808, 0.1]").expect("parses");
        let items = p.items(p.root.expect("root"));
        assert_eq!(p.int(Some(items[0])), Some(1 << 62));
        assert_eq!(p.int(Some(items[1])), Some(i64::MIN));
        assert_eq!(p.float(Some(items[2])), Some(0.1));
    }

    #[test]
    fn json_strings_and_frames_are_stored_once_and_deep_nesting_is_an_error() {
        let text = br#"[{"name": "f", "file": "a.py"}, {"name": "f", "file": "b.py"}, "f"]"#;
        let p = Pickle::from_json(text).expect("parses");
        let items = p.items(p.root.expect("root"));
        let name = |i: usize| p.get(items[i], "name").expect("name");
        assert_eq!(name(0), name(1), "equal strings are one string");
        assert_eq!(name(0), items[2]);
        assert_eq!(p.str(name(0)), Some("f"));
        assert_eq!(p.str(p.get(items[1], "file").expect("file")), Some("b.py"));
        // Strings with escapes (handed over as owned strings) are stored once too.
        let p = Pickle::from_json(br#"["a\u0062", "ab", "a\u0062"]"#).expect("parses");
        let items = p.items(p.root.expect("root"));
        assert_eq!((items[0], items[1]), (items[2], items[2]));
        assert_eq!(p.str(items[0]), Some("ab"));
        // Equal dicts of scalars (frames) are one dict, so lists of them have equal items; a
        // dict holding a container is made anew each time.
        let text = br#"[[{"f": "a", "l": 1}, {"f": "b", "l": 2}], [{"f": "a", "l": 1}, {"f": "b", "l": 2}],
            {"f": "a", "l": 2}, {"x": [1]}, {"x": [1]}]"#;
        let p = Pickle::from_json(text).expect("parses");
        let items = p.items(p.root.expect("root"));
        assert_eq!(p.items(items[0]), p.items(items[1]));
        assert_eq!(p.items(items[0]).len(), 2);
        assert_ne!(
            p.items(items[0])[0],
            items[2],
            "another line is another frame"
        );
        assert_eq!(p.int(p.get(items[2], "l")), Some(2));
        assert_ne!(items[3], items[4]);
        // Deeper than serde_json's limit: an error, not a stack overflow.
        let deep = [&[b'['; 200][..], &[b']'; 200][..]].concat();
        assert!(Pickle::from_json(&deep).is_err());
        // Trailing text and truncation are errors.
        assert!(Pickle::from_json(b"[1] x").is_err());
        assert!(Pickle::from_json(b"{\"a\": [1, 2").is_err());
    }

    /// A pseudo-random JSON document: nested arrays and objects (frames-like dicts repeated, so
    /// that they are shared), strings with escapes and UTF-8, every kind of number, literals,
    /// and whitespace between tokens.
    fn random_json(seed: u64, out: &mut alloc::string::String, depth: usize) {
        use core::fmt::Write;
        let mut st = seed;
        let mut next = move || {
            st = st
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            st >> 33
        };
        fn value(next: &mut impl FnMut() -> u64, out: &mut alloc::string::String, depth: usize) {
            const STRINGS: &[&str] = &[
                r#""""#,
                r#""a""#,
                r#""train.py""#,
                r#""line\nbreak \" quote \\ slash \/""#,
                r#""\u00e9t\u00E9 \ud83d\ude00""#,
                "\"\u{e9}t\u{e9} \u{1f600}\"",
                r#""\b\f\r\t""#,
            ];
            const NUMBERS: &[&str] = &[
                "0",
                "-0",
                "12",
                "-12",
                "1.5",
                "-1e10",
                "1E-5",
                "0.1",
                "2.5e+3",
                "9223372036854775807",
                "9223372036854775808",
                "18446744073709551615",
                "18446744073709551616",
                "-9223372036854775808",
                "-9223372036854775809",
                "123456789012345678901234567890",
            ];
            let ws = [" ", "", "\n  ", "\t", "\r\n"][(next() % 5) as usize];
            out.push_str(ws);
            match next() % if depth == 0 { 4 } else { 7 } {
                0 => out.push_str(STRINGS[(next() % STRINGS.len() as u64) as usize]),
                1 => out.push_str(NUMBERS[(next() % NUMBERS.len() as u64) as usize]),
                2 => out.push_str(["true", "false", "null"][(next() % 3) as usize]),
                3 => {
                    let _ = write!(
                        out,
                        r#"{{"filename": "f{}.py", "line": {}, "name": "g"}}"#,
                        next() % 3,
                        next() % 4
                    );
                }
                4 | 5 => {
                    out.push('[');
                    for k in 0..next() % 5 {
                        if k > 0 {
                            out.push(',');
                        }
                        value(next, out, depth - 1);
                    }
                    out.push_str(ws);
                    out.push(']');
                }
                _ => {
                    out.push('{');
                    for k in 0..next() % 5 {
                        if k > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, r#"{ws}"k{}"{ws}:"#, next() % 6);
                        value(next, out, depth - 1);
                    }
                    out.push_str(ws);
                    out.push('}');
                }
            }
            out.push_str(ws);
        }
        value(&mut next, out, depth);
    }

    /// The push parser builds exactly the arena serde_json's parse built (the same values, the
    /// same sharing), whole and in pieces cut anywhere, and refuses what serde_json refused.
    #[test]
    fn the_json_push_parser_equals_serde_json_whole_and_in_pieces() {
        let dump = |p: &Pickle| alloc::format!("{:?} {p:?}", p.root);
        let mut docs: Vec<alloc::string::String> = (0..400)
            .map(|seed| {
                let mut s = alloc::string::String::new();
                random_json(seed, &mut s, 5);
                s
            })
            .collect();
        docs.push(alloc::string::String::from_utf8(fixture("two-devices.json")).expect("utf-8"));
        let mut compared = 0;
        for doc in &docs {
            let text = doc.as_bytes();
            let reference = from_json_serde(text);
            let whole = Pickle::from_json(text);
            match (&reference, &whole) {
                (Ok(r), Ok(w)) => assert_eq!(dump(r), dump(w), "{doc}"),
                (Err(_), Err(_)) => continue,
                _ => panic!(
                    "serde_json {:?}, push {:?}: {doc}",
                    reference.err(),
                    whole.err()
                ),
            }
            compared += 1;
            // Every cut into two pieces (for short documents), and pieces of a few sizes.
            let cuts: Vec<usize> = if text.len() < 300 {
                (0..=text.len()).collect()
            } else {
                (0..=text.len()).step_by(text.len() / 40 + 1).collect()
            };
            for cut in cuts {
                let mut parser = JsonParser::new();
                parser.push(&text[..cut]).expect("first piece");
                parser.push(&text[cut..]).expect("second piece");
                let p = parser.finish().expect("parses in two pieces");
                assert_eq!(
                    dump(&p),
                    dump(whole.as_ref().expect("whole")),
                    "cut at {cut}: {doc}"
                );
            }
            let sizes: &[usize] = if text.len() < 5000 {
                &[1, 2, 3, 7, 64]
            } else {
                &[997, 4096, 65536]
            };
            for &size in sizes {
                let mut parser = JsonParser::new();
                for piece in text.chunks(size) {
                    parser.push(piece).expect("piece");
                }
                let p = parser.finish().expect("parses in pieces");
                assert_eq!(
                    dump(&p),
                    dump(whole.as_ref().expect("whole")),
                    "pieces of {size}"
                );
            }
        }
        assert!(compared > 300, "{compared} documents parsed");
        // Invalid documents: both refuse them, whole and byte by byte.
        let bad: &[&[u8]] = &[
            b"",
            b" ",
            b"[",
            b"[1,]",
            b"[1 2]",
            b"{\"a\" 1}",
            b"{\"a\":}",
            b"{1: 2}",
            b"{\"a\":1,}",
            b"01",
            b"1.",
            b".5",
            b"1e",
            b"-",
            b"+1",
            b"tru",
            b"nul",
            b"truex",
            b"1e400",
            b"-1e400",
            b"\"abc",
            b"\"a\\x\"",
            b"\"\\u12\"",
            b"\"\\ud800\"",
            b"\"\\udc00\"",
            b"\"\\ud800\\u0041\"",
            b"\"tab\there\"",
            b"\"\xff\"",
            b"[1] 2",
            b"{} {}",
            b"]",
            b"[\"a\" : 1]",
            b"nan",
            b"Infinity",
            b"[--1]",
            b"[1.5.3]",
            b"[0x10]",
        ];
        for doc in bad {
            assert!(
                from_json_serde(doc).is_err(),
                "serde_json accepts {:?}",
                alloc::string::String::from_utf8_lossy(doc)
            );
            assert!(
                Pickle::from_json(doc).is_err(),
                "accepted {:?}",
                alloc::string::String::from_utf8_lossy(doc)
            );
            let mut parser = JsonParser::new();
            let pushed = doc.chunks(1).try_for_each(|b| parser.push(b));
            assert!(
                pushed.is_err() || parser.finish().is_err(),
                "accepted in pieces {:?}",
                alloc::string::String::from_utf8_lossy(doc)
            );
        }
        // An error names where it is, in the whole text, and stays.
        let mut parser = JsonParser::new();
        parser.push(b"[1, 2,").expect("so far");
        let e = parser.push(b" ]").expect_err("a trailing comma");
        assert_eq!(e.offset, 7, "{e}");
        assert_eq!(parser.push(b"3]").expect_err("stays"), e);
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

    /// `[1, [2], 3]` built the way CPython batches long lists: two APPENDS with another list
    /// created between them, so the outer list must leave the flat arena and keep its order.
    #[test]
    fn lists_grown_in_batches_keep_their_order() {
        let mut b: Vec<u8> = alloc::vec![0x80, 4];
        b.extend_from_slice(b"]\x94(K\x01e"); // [] memo, MARK 1 APPENDS
        b.extend_from_slice(b"(]\x94K\x02aK\x03e."); // MARK [] 2 APPEND, 3 APPENDS, STOP
        let p = Pickle::parse(&b).expect("parses");
        let root = p.root.expect("root");
        let items = p.items(root);
        assert_eq!(items.len(), 3);
        assert_eq!(items[0], Value::Int(1));
        assert_eq!(p.items(items[1]), &[Value::Int(2)]);
        assert_eq!(items[2], Value::Int(3));
    }

    #[test]
    fn lists_with_the_same_items_share_them_and_grow_apart() {
        // [A, B, A, B, C] with A = [1, 2] + [3] and B = [1, 2] + [4] (each grown after both
        // were filled, B first sharing A's items), C = [1, 2]; checked against CPython's
        // `pickle.loads`: [[1, 2, 3], [1, 2, 4], [1, 2, 3], [1, 2, 4], [1, 2]].
        let b = b"\x80\x04](]\x94(K\x01K\x02e]\x94(K\x01K\x02eh\x00(K\x03eh\x01(K\x04e]\x94(K\x01K\x02ee.";
        let p = Pickle::parse(b).expect("parses");
        let lists = p.items(p.root.expect("root"));
        let ints = |v: Value| -> Vec<i64> {
            p.items(v)
                .iter()
                .map(|&x| p.int(Some(x)).expect("int"))
                .collect()
        };
        let got: Vec<Vec<i64>> = lists.iter().map(|&l| ints(l)).collect();
        assert_eq!(
            got,
            [&[1, 2, 3][..], &[1, 2, 4], &[1, 2, 3], &[1, 2, 4], &[1, 2]]
        );
        // C shares the items A and B were first filled with (the first copy), so readers that
        // cache by `items_key` find it; A and B, grown since, have keys of their own.
        let keys: Vec<_> = lists.iter().map(|&l| p.items_key(l)).collect();
        assert_ne!(keys[0], keys[1]);
        assert!(keys[4].is_some() && keys[4] != keys[0] && keys[4] != keys[1]);
        // The flat arena: [1, 2] once (A grew in place to [1, 2, 3]; B, grown after sharing,
        // moved to a vector of its own; C shares A's first two), then the outer list's items.
        assert_eq!(p.seqs.flat.len(), 3 + 5);
        assert_eq!(keys[4], Some((0, 2)));
    }

    #[test]
    fn a_reader_can_take_dicts_while_parsing() {
        // [{'a': 1}, {'b': 2}]: the callback takes dicts with an `a` key.
        let b = b"\x80\x04](}\x94(\x8c\x01a\x94K\x01u}\x94(\x8c\x01b\x94K\x02ue.";
        let mut seen = 0;
        let p = Pickle::parse_with(b, |p, kv| {
            seen += 1;
            (p.str(kv[0]) == Some("a")).then_some(7)
        })
        .expect("parses");
        assert_eq!(seen, 2);
        let items = p.items(p.root.expect("root")).to_vec();
        assert_eq!(p.taken(items[0]), Some(7));
        assert!(p.entries(items[0]).is_empty());
        assert_eq!(p.taken(items[1]), None);
        assert_eq!(p.get(items[1], "b"), Some(Value::Int(2)));
    }

    #[test]
    fn marks_and_stack_underflow_are_errors() {
        // SETITEMS with no MARK, APPEND on an empty stack, POP_MARK without a MARK.
        for bad in [&b"\x80\x04}u."[..], b"\x80\x04a.", b"\x80\x041."] {
            assert!(
                matches!(Pickle::parse(bad), Err(PickleError::Malformed { .. })),
                "{bad:?}"
            );
        }
        // A value pushed after a MARK cannot be popped past it.
        assert!(Pickle::parse(b"\x80\x04K\x01(\x86.").is_err());
    }

    /// What a parse gives: the pickle (arena, memo-shared values and all), or the error, and
    /// every dict offered to the callback. The callback takes dicts with an `action` key, as
    /// the snapshot reader does.
    #[test]
    fn lists_of_the_same_memo_references_share_until_a_key_is_bound_again() {
        // ['a', 'b', {'f': ['a', 'b']}, {'f': ['a', 'b']}, 'c', {'f': ['c', 'b']}], the three
        // lists written with the same bytes (`BINGET 1, BINGET 2`) but memo key 1 bound to 'c'
        // (BINPUT) before the third; checked against CPython's `pickle.loads`.
        let b = b"\x80\x04]\x94(\x8c\x01a\x94\x8c\x01b\x94}\x94(\x8c\x01f\x94]\x94(h\x01h\x02eu}\x94(h\x04]\x94(h\x01h\x02eu\x8c\x01cq\x01}\x94(h\x04]\x94(h\x01h\x02eue.";
        let p = Pickle::parse(b).expect("parses");
        let items = p.items(p.root.expect("root"));
        let lists: Vec<Value> = [2, 3, 5]
            .iter()
            .map(|&i| p.get(items[i], "f").expect("a list under f"))
            .collect();
        let strs = |l: Value| -> Vec<&str> {
            p.items(l).iter().map(|&v| p.str(v).expect("str")).collect()
        };
        assert_eq!(strs(lists[0]), ["a", "b"]);
        assert_eq!(strs(lists[1]), ["a", "b"]);
        assert_eq!(strs(lists[2]), ["c", "b"]);
        // The second list takes the first one's items; the third has its own.
        assert_eq!(p.items_key(lists[0]), p.items_key(lists[1]));
        assert_ne!(p.items_key(lists[0]), p.items_key(lists[2]));
        // As the generic machine has it, cut anywhere.
        for cut in 0..b.len() {
            let chunks = [&b[..cut], &b[cut..]];
            assert_eq!(
                outcome(Parser::incremental(0), &chunks),
                outcome(Parser::incremental(0).generic_only(), &chunks),
                "cut at {cut}"
            );
        }
    }

    fn outcome(parser: Parser<'_>, chunks: &[&[u8]]) -> alloc::string::String {
        use alloc::string::String;
        let mut parser = parser;
        let mut offered = String::new();
        let mut take = |p: &Pickle, kv: &[Value]| {
            offered.push_str(&alloc::format!("{kv:?};"));
            let n = offered.len() as u32;
            (p.str(kv[0]) == Some("action")).then_some(n)
        };
        let mut result = Ok(false);
        for chunk in chunks {
            result = parser
                .push(chunk)
                .and_then(|()| parser.advance(&mut take, false));
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = parser.advance(&mut take, true);
        }
        let p = parser.into_pickle();
        let text = alloc::format!(
            "{:?} {:?} {:?} {:?} {:?}",
            p.root,
            p.texts,
            p.seqs,
            p.dicts,
            result
        );
        alloc::format!("{text}\n{offered}")
    }

    fn fixture(name: &str) -> Vec<u8> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/assets/torch/");
        std::fs::read(alloc::format!("{dir}{name}")).expect("fixture exists")
    }

    /// The fast path for dicts has exactly the generic machine's effect: same arena, memo,
    /// callback calls and errors, on the snapshot fixtures and on every truncation of them.
    #[test]
    fn the_fast_path_for_dicts_equals_the_generic_machine() {
        for name in [
            "two-devices.pickle",
            "ring-buffer.pickle",
            "real-torch.pickle",
        ] {
            let b = fixture(name);
            let cuts = (1..120)
                .chain((120..b.len()).step_by(4999))
                .chain([b.len()]);
            for cut in cuts {
                let b = &b[..cut];
                let fast = outcome(Parser::new(b).expect("small"), &[]);
                let generic = outcome(Parser::new(b).expect("small").generic_only(), &[]);
                assert_eq!(fast, generic, "{name} cut at {cut}");
            }
        }
        for b in [
            SAMPLE,
            b"\x80\x04](}\x94(\x8c\x01a\x94K\x01u}\x94(\x8c\x01b\x94K\x02ue.",
        ] {
            let fast = outcome(Parser::new(b).expect("small"), &[]);
            let generic = outcome(Parser::new(b).expect("small").generic_only(), &[]);
            assert_eq!(fast, generic);
        }
    }

    /// Dicts the fast path leaves half-way: a memo reference to a sparse key, a string that is
    /// not UTF-8, an odd SETITEMS, a nested list and tuple, a BINPUT: same as generic.
    #[test]
    fn the_fast_path_falls_back_anywhere_like_the_generic_machine() {
        let cases: [&[u8]; 6] = [
            b"\x80\x04K\x07r\x10\x00\x00\x00}\x94(j\x10\x00\x00\x00K\x01u.",
            b"\x80\x04}\x94(\x8c\x01\xffK\x01u.",
            b"\x80\x04}\x94(\x8c\x01aK\x01\x8c\x01bu.",
            b"\x80\x04}\x94(\x8c\x01a](K\x01K\x02e\x8c\x01bK\x01K\x02\x86\x94u.",
            b"\x80\x04}q\x00(\x8c\x01aq\x01\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01h\x01\x8a\x02\xff\x7fu.",
            b"\x80\x04}(\x8c\x01aG?\xf0\x00\x00\x00\x00\x00\x00\x8c\x01bN\x8c\x01c\x88u.",
        ];
        for b in cases {
            let fast = outcome(Parser::new(b).expect("small"), &[]);
            let generic = outcome(Parser::new(b).expect("small").generic_only(), &[]);
            assert_eq!(fast, generic, "{b:?}");
        }
    }

    /// Pushed in pieces, a pickle parses exactly as in one piece, wherever it is cut: in two
    /// pieces at every point, and byte by byte; cut short, it fails at the end as the whole
    /// truncated input does.
    #[test]
    fn pieces_parse_like_the_whole() {
        let ring = fixture("ring-buffer.pickle");
        for b in [SAMPLE, &ring[..3000], &ring[..]] {
            let whole = outcome(Parser::new(b).expect("small"), &[]);
            let step = if b.len() > 4000 { 1999 } else { 1 };
            for cut in (0..=b.len()).step_by(step) {
                let (x, y) = b.split_at(cut);
                assert_eq!(
                    outcome(Parser::incremental(b.len()), &[x, y]),
                    whole,
                    "cut at {cut}"
                );
            }
            let bytes: Vec<&[u8]> = b.chunks(1).collect();
            assert_eq!(outcome(Parser::incremental(0), &bytes), whole);
        }
        // Truncated: the same error at the end, never before.
        for cut in [1, 5, SAMPLE.len() / 2, SAMPLE.len() - 1] {
            let b = &SAMPLE[..cut];
            let whole = outcome(Parser::new(b).expect("small"), &[]);
            assert!(whole.contains("Truncated"), "{whole}");
            let bytes: Vec<&[u8]> = b.chunks(1).collect();
            assert_eq!(outcome(Parser::incremental(0), &bytes), whole);
        }
        // Errors other than truncation come as soon as the opcode is there, at their offset in
        // the whole input (not in the piece).
        let mut p = Parser::incremental(0);
        for piece in [&b"\x80\x04"[..], b"N", b"\x8c\x01"] {
            p.push(piece).expect("small");
            assert_eq!(p.advance(&mut |_, _| None, false), Ok(false));
        }
        p.push(b"a\x93").expect("small");
        assert!(matches!(
            p.advance(&mut |_, _| None, false),
            Err(PickleError::Unsupported {
                opcode: 0x93,
                offset: 6
            })
        ));
    }

    /// Parsed input is dropped as pieces come: the parser keeps the strings, never the file.
    #[test]
    fn pieces_are_dropped_once_parsed() {
        let ring = fixture("ring-buffer.pickle");
        let mut parser = Parser::incremental(ring.len());
        for piece in ring.chunks(4096) {
            parser.push(piece).expect("small");
            parser.advance(&mut |_, _| None, false).expect("parses");
            // At most the opcode cut by the end of the piece waits (the fixture's are short).
            assert!(parser.input.len() < 64, "{}", parser.input.len());
        }
        assert_eq!(parser.advance(&mut |_, _| None, true), Ok(true));
        assert!(parser.p.texts.bytes.len() < ring.len() / 10);
        let whole = outcome(Parser::new(&ring).expect("small"), &[]);
        let mut pieces = Parser::incremental(0);
        pieces.push(&ring[..ring.len() / 2]).expect("small");
        assert_eq!(outcome(pieces, &[&ring[ring.len() / 2..]]), whole);
    }
}
