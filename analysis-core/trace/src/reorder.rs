//! Items of a history read in id order and given in time order, with memory bounded by how far
//! the times step back rather than by the history: where the allocation times of a trace step
//! back (the processes of a multi-process run, or threads whose records reached the ring out
//! of order), a pass that needs them in time order reads them as they are stored and reorders
//! them as it goes. A first pass keeps the earliest allocation time of each chunk of
//! allocations ([`chunk_least`], 8 bytes a chunk); the allocations are then read a chunk at a
//! time, their items queued, and an item is given once no allocation still unread can give one
//! before it: those come at or after the earliest time of the chunks unread, with higher ids.

use alloc::collections::BinaryHeap;
use alloc::vec::Vec;
use core::cmp::Ordering;

/// Allocations read at once.
pub(crate) const CHUNK: usize = 4096;

/// The earliest of `times` (every allocation's, in id order) in each chunk of `chunk`.
pub(crate) fn chunk_least(times: impl Iterator<Item = u64>, chunk: usize) -> Vec<u64> {
    let mut least = Vec::new();
    for (i, t) in times.enumerate() {
        match least.last_mut() {
            Some(l) if i % chunk != 0 => *l = t.min(*l),
            _ => least.push(t),
        }
    }
    least
}

/// A queued item, its key `K` first (the least given first), with what it carries.
struct Entry<K, P>(K, P);

impl<K: Ord, P> PartialEq for Entry<K, P> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<K: Ord, P> Eq for Entry<K, P> {}

impl<K: Ord, P> PartialOrd for Entry<K, P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K: Ord, P> Ord for Entry<K, P> {
    /// Reversed: the heap gives its least key first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.cmp(&self.0)
    }
}

/// How far a reordering has read: the earliest allocation time from each chunk to the end,
/// and the allocations read (a chunk at a time).
struct Progress {
    least: Vec<u64>,
    chunk: usize,
    read: usize,
    len: usize,
}

impl Progress {
    /// For `len` allocations whose chunks of `chunk` have the earliest times `least`
    /// ([`chunk_least`]).
    fn new(mut least: Vec<u64>, chunk: usize, len: usize) -> Self {
        for c in (1..least.len()).rev() {
            least[c - 1] = least[c - 1].min(least[c]);
        }
        Self {
            least,
            chunk: chunk.max(1),
            read: 0,
            len,
        }
    }

    fn done(&self) -> bool {
        self.read >= self.len
    }

    /// The earliest time and the first id of the allocations still unread (`None`: all read).
    fn unread(&self) -> Option<(u64, u32)> {
        (!self.done()).then(|| (self.least[self.read / self.chunk], self.read as u32))
    }

    /// Reads the rest of the chunk, an allocation per `read()`, which says when the history
    /// ended (`false`).
    fn read_chunk(&mut self, mut read: impl FnMut() -> bool) {
        let end = (self.read / self.chunk + 1)
            .saturating_mul(self.chunk)
            .min(self.len);
        while self.read < end {
            if !read() {
                self.read = self.len;
                break;
            }
            self.read += 1;
        }
    }
}

/// The reordering of [`self`](crate::reorder): keys `K` in order, each with its `P`.
pub(crate) struct Reorder<K, P> {
    progress: Progress,
    queue: BinaryHeap<Entry<K, P>>,
}

impl<K: Ord, P> Reorder<K, P> {
    /// For `len` allocations whose chunks of `chunk` have the earliest times `least`
    /// ([`chunk_least`]).
    pub(crate) fn new(least: Vec<u64>, chunk: usize, len: usize) -> Self {
        Self {
            progress: Progress::new(least, chunk, len),
            queue: BinaryHeap::new(),
        }
    }

    /// The next item in key order. `unread(t, id)` is the least key an allocation with id `id`
    /// or higher, made at `t` or later, can give; `read(queue)` reads the next allocation and
    /// queues its items with `queue(key, item)`, or says the history ended (`false`).
    pub(crate) fn next(
        &mut self,
        unread: impl Fn(u64, u32) -> K,
        mut read: impl FnMut(&mut dyn FnMut(K, P)) -> bool,
    ) -> Option<(K, P)> {
        loop {
            if let Some(first) = self.queue.peek() {
                let given = self
                    .progress
                    .unread()
                    .is_none_or(|(t, id)| first.0 < unread(t, id));
                if given {
                    return self.queue.pop().map(|e| (e.0, e.1));
                }
            }
            if self.progress.done() {
                return None;
            }
            let queue = &mut self.queue;
            self.progress
                .read_chunk(|| read(&mut |k, p| queue.push(Entry(k, p))));
        }
    }
}

/// [`Reorder`] for items that never wait long, one per allocation (its own time): each item
/// read is put in order among those that still wait, from the back (a record out of order by
/// a few allocations moves past a few), rather than queued in a heap, which on a history
/// mostly in order cost dozens of comparisons an item; a chunk with an item further out of
/// order is sorted once read.
pub(crate) struct SortedChunks<K, P> {
    progress: Progress,
    /// Items read and not yet given, sorted from `at` on.
    items: Vec<(K, P)>,
    at: usize,
    /// The least key an unread allocation can give (`None`: all read).
    bound: Option<K>,
}

/// How far back an item read is moved into place before the chunk is sorted instead.
const NEAR: usize = 32;

impl<K: Ord + Copy, P: Copy> SortedChunks<K, P> {
    /// [`Reorder::new`].
    pub(crate) fn new(least: Vec<u64>, chunk: usize, len: usize) -> Self {
        Self {
            progress: Progress::new(least, chunk, len),
            items: Vec::new(),
            at: 0,
            bound: None,
        }
    }

    /// [`Reorder::next`], `read` giving the next allocation's one item, or `None` where the
    /// history ended.
    #[inline]
    pub(crate) fn next(
        &mut self,
        unread: impl Fn(u64, u32) -> K,
        mut read: impl FnMut() -> Option<(K, P)>,
    ) -> Option<(K, P)> {
        loop {
            if let Some(&first) = self.items.get(self.at)
                && self.bound.is_none_or(|b| first.0 < b)
            {
                self.at += 1;
                return Some(first);
            }
            if self.progress.done() {
                return None;
            }
            self.refill(&unread, &mut read);
        }
    }

    /// Reads the next chunk into the items waiting.
    #[cold]
    fn refill(
        &mut self,
        unread: &impl Fn(u64, u32) -> K,
        read: &mut impl FnMut() -> Option<(K, P)>,
    ) {
        let items = &mut self.items;
        items.drain(..self.at);
        self.at = 0;
        let mut sort = false;
        self.progress.read_chunk(|| {
            let Some(item) = read() else {
                return false;
            };
            let n = items.len();
            if sort || items.last().is_none_or(|l| l.0 < item.0) {
                items.push(item);
                return true;
            }
            let from = n.saturating_sub(NEAR);
            match items[from..].iter().rposition(|x| x.0 < item.0) {
                Some(k) => items.insert(from + k + 1, item),
                None if from == 0 => items.insert(0, item),
                None => {
                    items.push(item);
                    sort = true;
                }
            }
            true
        });
        if sort {
            items.sort_unstable_by_key(|a| a.0);
        }
        self.bound = self.progress.unread().map(|(t, id)| unread(t, id));
    }
}
