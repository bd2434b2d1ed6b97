//! Causes: the user's line (see `crate::attribution`) of every stack, in one process, on one
//! device or in its pinned host memory. Built once per analysis, read by `leaks` and `spikes`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;

use super::Config;
use crate::format::{AllocKind, DeviceIdx, ProcessIdx, StackId};
use crate::model::{Fields, TraceModel};

/// A cause: (process, device, pinned host, label).
pub type CauseKey = (ProcessIdx, DeviceIdx, bool, String);

/// What a cause needs to know of one stack.
#[derive(Clone)]
struct StackFacts {
    label: String,
    location: String,
    /// File and function of the user's frame.
    function: (String, String),
    python: bool,
    /// Passes through a caching allocator or pool.
    allocator: bool,
    /// No frame of it is the user's: a library's own memory.
    library: bool,
    /// A block a snapshot's history does not reach back to (the reader's marker first).
    prehistory: bool,
}

/// What every allocation of one (process, device, pinned host, stack) reads.
#[derive(Clone, Copy)]
struct Seen {
    pair: u32,
    cause: u32,
    allocator: bool,
    prehistory: bool,
}

/// Causes of every stack, built once.
pub struct Causes {
    pub keys: Vec<CauseKey>,
    /// `file:line` of each cause's frame.
    pub locations: Vec<String>,
    /// `file` and function of each cause's frame (to fold lines of one function).
    pub functions: Vec<(String, String)>,
    /// Whether any stack of the cause has Python frames.
    pub python: Vec<bool>,
    /// Whether any stack of the cause passes through a caching allocator.
    pub allocator: Vec<bool>,
    /// Whether the cause's frame is a library's (no user frame in its stacks).
    pub library: Vec<bool>,
    /// The stack with the most bytes of each cause.
    pub top_stack: Vec<(StackId, u64)>,
    /// Stacks of blocks that predate a snapshot's history, sorted.
    pub prehistory: Vec<StackId>,
    /// The (cause, stack) pair of each allocation, as a dense index: a cause is one line in
    /// one process, on one device or in pinned host memory, so each pair is one (process,
    /// device, pinned host, stack), numbered in order of first allocation.
    by_alloc: PairIds,
    /// The cause and the stack of each pair.
    pairs: Vec<(u32, StackId)>,
}

/// The pair of each allocation, in the narrowest integers that hold every pair so far: a
/// trace has few call sites, so this is a byte per allocation rather than 4.
enum PairIds {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
}

impl PairIds {
    #[inline]
    fn push(&mut self, pair: u32) {
        match self {
            Self::U8(v) => match u8::try_from(pair) {
                Ok(p) => v.push(p),
                Err(_) => {
                    *self = Self::U16(widened(v, v.capacity()));
                    self.push(pair);
                }
            },
            Self::U16(v) => match u16::try_from(pair) {
                Ok(p) => v.push(p),
                Err(_) => {
                    *self = Self::U32(widened(v, v.capacity()));
                    self.push(pair);
                }
            },
            Self::U32(v) => v.push(pair),
        }
    }

    #[inline]
    fn get(&self, i: usize) -> usize {
        match self {
            Self::U8(v) => usize::from(v[i]),
            Self::U16(v) => usize::from(v[i]),
            Self::U32(v) => v[i] as usize,
        }
    }
}

/// `v`'s ids in a wider integer, in a vector of `capacity`.
fn widened<A: Copy, B: From<A>>(v: &[A], capacity: usize) -> Vec<B> {
    let mut w = Vec::with_capacity(capacity.max(v.len()));
    w.extend(v.iter().map(|&p| B::from(p)));
    w
}

fn through_caching_allocator(m: &TraceModel, stack: StackId) -> bool {
    m.stack_frames(stack).iter().any(|f| {
        f.function.contains("CachingAllocator")
            || f.function.contains("CachingHostAllocator")
            || f.function.contains("MemoryPool::")
            || f.function.contains("BFCAllocator")
            || f.file.contains("cupy/cuda/memory")
    })
}

fn stack_facts(m: &TraceModel, c: &Config, stack: StackId) -> StackFacts {
    let mut frames = m.stack_frames(stack);
    // A reader's marker (`<allocated before the snapshot's history began>`) stays in the
    // label; the cause is the user's line under it, so these blocks join their line.
    let prehistory = frames
        .first()
        .is_some_and(|f| f.file.is_empty() && f.function.starts_with('<'));
    if prehistory {
        frames.remove(0);
    }
    let users = crate::attribution::user_frame_indexes(&frames, &c.hide_frames);
    let f = users
        .first()
        .copied()
        .or_else(|| crate::attribution::user_frame_index(&frames, &c.hide_frames))
        .map(|i| frames[i].clone());
    let label = f
        .as_ref()
        .map_or_else(|| "<no stack>".into(), |f| format!("{f}"));
    let location = f
        .as_ref()
        .filter(|f| !f.file.is_empty() && f.file != "??")
        .map(|f| format!("{}:{}", f.file, f.line))
        .unwrap_or_default();
    StackFacts {
        label,
        location,
        function: f.map(|f| (f.file, f.function)).unwrap_or_default(),
        // Python source, not Python frame records: snapshots record C++ frames that way too.
        python: frames.iter().any(|f| f.file.ends_with(".py")),
        allocator: through_caching_allocator(m, stack),
        library: users.is_empty(),
        prehistory,
    }
}

impl Causes {
    pub fn new(m: &TraceModel, c: &Config) -> Self {
        let mut facts: HashMap<StackId, StackFacts> = HashMap::new();
        let mut index: HashMap<CauseKey, u32> = HashMap::new();
        // Each (process, device, pinned host, stack) seen: its pair and the stack's facts that
        // every allocation reads. Only a new one builds the cause's key (a label string).
        let mut seen: HashMap<(ProcessIdx, DeviceIdx, bool, StackId), Seen> = HashMap::new();
        let mut out = Causes {
            keys: Vec::new(),
            locations: Vec::new(),
            functions: Vec::new(),
            python: Vec::new(),
            allocator: Vec::new(),
            library: Vec::new(),
            top_stack: Vec::new(),
            prehistory: Vec::new(),
            by_alloc: PairIds::U8(Vec::with_capacity(m.allocs.len())),
            pairs: Vec::new(),
        };
        let fields = Fields::KIND | Fields::PROCESS | Fields::DEVICE | Fields::STACK | Fields::SIZE;
        for a in m.allocs.iter_fields(fields) {
            let host = a.kind == AllocKind::PinnedHost;
            let s = *seen
                .entry((a.process, a.device, host, a.stack))
                .or_insert_with(|| {
                    let f = facts
                        .entry(a.stack)
                        .or_insert_with(|| stack_facts(m, c, a.stack));
                    let key = (a.process, a.device, host, f.label.clone());
                    let next = out.keys.len() as u32;
                    let i = *index.entry(key.clone()).or_insert(next);
                    if i == next {
                        out.keys.push(key);
                        out.locations.push(f.location.clone());
                        out.functions.push(f.function.clone());
                        out.python.push(false);
                        out.allocator.push(false);
                        out.library.push(f.library);
                        out.top_stack.push((a.stack, 0));
                    }
                    out.python[i as usize] |= f.python;
                    out.pairs.push((i, a.stack));
                    Seen {
                        pair: out.pairs.len() as u32 - 1,
                        cause: i,
                        allocator: f.allocator,
                        prehistory: f.prehistory,
                    }
                });
            let ci = s.cause as usize;
            out.allocator[ci] |= s.allocator || a.kind == AllocKind::StreamOrderedPool;
            let t = &mut out.top_stack[ci];
            if t.0 == a.stack {
                t.1 = t.1.saturating_add(a.size_bytes);
            } else if a.size_bytes > t.1 && !s.prehistory {
                *t = (a.stack, a.size_bytes);
            }
            out.by_alloc.push(s.pair);
        }
        out.prehistory = facts
            .iter()
            .filter(|(_, f)| f.prehistory)
            .map(|(s, _)| *s)
            .collect();
        out.prehistory.sort_unstable();
        out
    }

    /// The cause of allocation `alloc_index`.
    #[inline]
    pub fn of(&self, alloc_index: usize) -> usize {
        self.pairs[self.pair_of(alloc_index)].0 as usize
    }

    /// The (cause, stack) pair of allocation `alloc_index`, a dense index below
    /// [`Self::pair_count`]: per-pair tables are vectors, not maps.
    #[inline]
    pub fn pair_of(&self, alloc_index: usize) -> usize {
        self.by_alloc.get(alloc_index)
    }

    pub fn pair_count(&self) -> usize {
        self.pairs.len()
    }

    /// The cause and the stack of pair `pair`.
    pub fn pair(&self, pair: usize) -> (usize, StackId) {
        let (c, s) = self.pairs[pair];
        (c as usize, s)
    }

    pub fn label(&self, cause: usize) -> &str {
        &self.keys[cause].3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pair ids read back as pushed while the storage widens from bytes to 16 and 32 bits.
    #[test]
    fn pair_ids_widen_and_keep_every_id() {
        let ids: Vec<u32> = (0..70_000u32)
            .map(|i| if i % 3 == 0 { i } else { i % 200 })
            .collect();
        let mut p = PairIds::U8(Vec::new());
        for (n, &id) in ids.iter().enumerate() {
            p.push(id);
            if n == 255 || n == 65_535 || n == 69_999 {
                assert!(
                    ids[..=n]
                        .iter()
                        .enumerate()
                        .all(|(i, &x)| p.get(i) == x as usize)
                );
            }
        }
        assert!(matches!(p, PairIds::U32(_)));
    }
}
