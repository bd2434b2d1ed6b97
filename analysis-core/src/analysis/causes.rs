//! Causes: the user's line (see `crate::attribution`) of every stack, in one process, on one
//! device or in its pinned host memory. Built once per analysis, read by `leaks` and `spikes`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;

use super::Config;
use crate::format::{AllocKind, DeviceIdx, ProcessIdx, StackId};
use crate::model::{AllocRecord, Fields, TraceModel};

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
    allocator: bool,
    prehistory: bool,
}

/// A stack's first (process, device, pinned host) and its pair: most stacks allocate in one
/// process on one device, so the pair is found by the stack's id and one comparison.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FirstPair {
    process: ProcessIdx,
    device: DeviceIdx,
    host: bool,
    pair: u32,
}

/// No pair yet (`FirstPair::pair`).
const NO_PAIR: u32 = u32::MAX;

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
    /// The pair of each stack's first (process, device, pinned host), by the stack's id (ids
    /// below the model's count of stacks and a margin: writers intern them densely).
    first: Vec<FirstPair>,
    /// The pair of every other (process, device, pinned host, stack): a stack allocating on
    /// several devices or in several processes, or a sparse id.
    other: HashMap<(ProcessIdx, DeviceIdx, bool, StackId), u32>,
    /// The cause and the stack of each pair.
    pairs: Vec<(u32, StackId)>,
}

/// Stack ids past the model's count of stacks that still get a slot of [`Causes::first`]:
/// a trace whose allocations name stacks it never defines.
const DENSE_MARGIN: usize = 1024;

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
    /// The fields of an allocation its pair is found by ([`Self::pair_of`]).
    pub const FIELDS: Fields = Fields::PROCESS
        .and(Fields::DEVICE)
        .and(Fields::KIND)
        .and(Fields::STACK);

    pub fn new(m: &TraceModel, c: &Config) -> Self {
        let mut facts: HashMap<StackId, StackFacts> = HashMap::new();
        let mut index: HashMap<CauseKey, u32> = HashMap::new();
        // What each pair's allocations read. Only a new pair builds the cause's key (a label
        // string).
        let mut seen: Vec<Seen> = Vec::new();
        let dense = m.stacks.len().saturating_add(DENSE_MARGIN);
        let mut out = Causes {
            keys: Vec::new(),
            locations: Vec::new(),
            functions: Vec::new(),
            python: Vec::new(),
            allocator: Vec::new(),
            library: Vec::new(),
            top_stack: Vec::new(),
            prehistory: Vec::new(),
            first: Vec::new(),
            other: HashMap::new(),
            pairs: Vec::new(),
        };
        let fields = Self::FIELDS | Fields::SIZE;
        for a in m.allocs.iter_fields(fields) {
            let pair = match out.find(&a) {
                Some(p) => p,
                None => {
                    let host = a.kind == AllocKind::PinnedHost;
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
                    seen.push(Seen {
                        allocator: f.allocator,
                        prehistory: f.prehistory,
                    });
                    let pair = out.pairs.len() as u32 - 1;
                    out.insert(&a, pair, dense);
                    pair as usize
                }
            };
            let s = seen[pair];
            let ci = out.pairs[pair].0 as usize;
            out.allocator[ci] |= s.allocator || a.kind == AllocKind::StreamOrderedPool;
            let t = &mut out.top_stack[ci];
            if t.0 == a.stack {
                t.1 = t.1.saturating_add(a.size_bytes);
            } else if a.size_bytes > t.1 && !s.prehistory {
                *t = (a.stack, a.size_bytes);
            }
        }
        out.prehistory = facts
            .iter()
            .filter(|(_, f)| f.prehistory)
            .map(|(s, _)| *s)
            .collect();
        out.prehistory.sort_unstable();
        out
    }

    /// The pair of `a`'s (process, device, pinned host, stack), if it has one yet.
    #[inline]
    fn find(&self, a: &AllocRecord) -> Option<usize> {
        let host = a.kind == AllocKind::PinnedHost;
        if let Some(f) = self.first.get(a.stack.0 as usize)
            && f.process == a.process
            && f.device == a.device
            && f.host == host
            && f.pair != NO_PAIR
        {
            return Some(f.pair as usize);
        }
        self.find_other(a, host)
    }

    /// [`Self::find`] past the stack's first pair.
    #[inline(never)]
    fn find_other(&self, a: &AllocRecord, host: bool) -> Option<usize> {
        self.other
            .get(&(a.process, a.device, host, a.stack))
            .map(|&p| p as usize)
    }

    /// Gives `a`'s (process, device, pinned host, stack) pair `pair`: the stack's first slot
    /// when it is free and its id is below `dense`, the map otherwise.
    fn insert(&mut self, a: &AllocRecord, pair: u32, dense: usize) {
        let host = a.kind == AllocKind::PinnedHost;
        let i = a.stack.0 as usize;
        if i < dense {
            if i >= self.first.len() {
                self.first.resize(
                    i + 1,
                    FirstPair {
                        process: ProcessIdx(0),
                        device: DeviceIdx(0),
                        host: false,
                        pair: NO_PAIR,
                    },
                );
            }
            let f = &mut self.first[i];
            if f.pair == NO_PAIR {
                *f = FirstPair {
                    process: a.process,
                    device: a.device,
                    host,
                    pair,
                };
                return;
            }
        }
        self.other
            .insert((a.process, a.device, host, a.stack), pair);
    }

    /// The cause of allocation `a`, read with at least [`Self::FIELDS`].
    #[inline]
    pub fn of(&self, a: &AllocRecord) -> usize {
        self.pairs[self.pair_of(a)].0 as usize
    }

    /// The (cause, stack) pair of allocation `a`, read with at least [`Self::FIELDS`]: a dense
    /// index below [`Self::pair_count`], so per-pair tables are vectors, not maps. Every
    /// allocation of the model has one ([`Self::new`] saw them all).
    #[inline]
    pub fn pair_of(&self, a: &AllocRecord) -> usize {
        self.find(a).unwrap_or(0)
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
    use crate::synth::{Scenario, generate};
    use proptest::prelude::*;

    /// Every allocation's pair is its (process, device, pinned host, stack) numbered in order of
    /// first allocation, the pair's stack is the allocation's, and its cause is in the
    /// allocation's process, on its device and in its kind of memory.
    fn assert_pairs_of_every_allocation(m: &TraceModel) {
        let causes = Causes::new(m, &Config::default());
        let mut reference: HashMap<(ProcessIdx, DeviceIdx, bool, StackId), usize> = HashMap::new();
        for a in m.allocs.iter() {
            let host = a.kind == AllocKind::PinnedHost;
            let next = reference.len();
            let want = *reference
                .entry((a.process, a.device, host, a.stack))
                .or_insert(next);
            let pair = causes.pair_of(&a);
            assert_eq!(pair, want);
            let (ci, stack) = causes.pair(pair);
            assert_eq!(stack, a.stack);
            assert_eq!(causes.of(&a), ci);
            let key = &causes.keys[ci];
            assert_eq!((key.0, key.1, key.2), (a.process, a.device, host));
        }
        assert_eq!(causes.pair_count(), reference.len());
    }

    #[test]
    fn every_scenario_allocation_has_its_pair() {
        for s in Scenario::ALL {
            let (bytes, _) = generate(s, 4_000, 3);
            let t = crate::load(&bytes).expect("synthetic trace loads");
            assert_pairs_of_every_allocation(&t.model);
        }
    }

    proptest! {
        /// Stacks shared by processes, devices and kinds of memory, dense ids and sparse ones
        /// (past the ids the stack's slot is kept for): each allocation finds its own pair.
        #[test]
        fn shared_and_sparse_stacks_find_their_pairs(
            allocs in proptest::collection::vec(
                (0u32..3, 0u32..3, any::<bool>(), 0u32..6, any::<bool>()),
                1..200,
            ),
        ) {
            use crate::encode::Encoder;
            use crate::format::Alloc;
            let mut enc = Encoder::new(&Encoder::header_v1());
            for (t, &(process, device, host, stack, sparse)) in allocs.iter().enumerate() {
                let stack = if sparse { 4_000_000_000 + stack } else { stack };
                enc.alloc(&Alloc {
                    ts_nanos: t as u64 + 1,
                    size_bytes: 256,
                    address: (t as u64 + 1) << 12,
                    stack: StackId(stack),
                    process: ProcessIdx(process),
                    device: DeviceIdx(device),
                    kind: if host { AllocKind::PinnedHost } else { AllocKind::Device },
                    ..Alloc::default()
                });
            }
            let t = crate::load(&enc.into_bytes()).expect("trace loads");
            prop_assert_eq!(t.model.allocs.len(), allocs.len());
            assert_pairs_of_every_allocation(&t.model);
        }
    }
}
