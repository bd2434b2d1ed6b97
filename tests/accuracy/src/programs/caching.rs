//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`), enough to
//! give a history the block sizes, segments and reserve a real program shows:
//!
//! - requests are rounded up to 512 B (`kMinBlockSize`);
//! - requests of at most 1 MiB come from the small pool, carved out of 2 MiB segments; larger
//!   ones from the large pool: 20 MiB segments for requests under 10 MiB, else a dedicated
//!   segment rounded up to 2 MiB;
//! - the best-fitting cached block is reused; it is split only when the remainder is at least
//!   512 B (small pool) or more than 1 MiB (large pool), so a block can be bigger than its
//!   request;
//! - freed blocks are cached (merged with free neighbours), never returned to the driver, so the
//!   reserve plateaus; when a new segment would not fit on the device, wholly free segments are
//!   released first (`release_cached_blocks`) and the request fails only if it still does not
//!   fit.

use std::collections::BTreeMap;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

const MIN_BLOCK: u64 = 512;
const SMALL_SIZE: u64 = MIB;
const SMALL_BUFFER: u64 = 2 * MIB;
const LARGE_BUFFER: u64 = 20 * MIB;
const MIN_LARGE_ALLOC: u64 = 10 * MIB;
const ROUND_LARGE: u64 = 2 * MIB;

/// A request rounded as the allocator rounds it.
pub fn round_request(request: u64) -> u64 {
    request.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK
}

/// The segment size the allocator asks the driver for, for a rounded request.
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[derive(Clone, Debug)]
struct Block {
    size: u64,
    used: bool,
}

#[derive(Clone, Debug)]
pub struct Segment {
    pub addr: u64,
    pub size: u64,
    pub small: bool,
    blocks: BTreeMap<u64, Block>,
}

impl Segment {
    /// (address, size, used) of every block, in address order.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, u64, bool)> + '_ {
        self.blocks.iter().map(|(a, b)| (*a, b.size, b.used))
    }
}

/// What a successful `malloc` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malloc {
    pub addr: u64,
    /// The block's size (what `memory_allocated` counts): at least the rounded request.
    pub block_bytes: u64,
    /// A segment the allocator had to reserve from the driver for it.
    pub new_segment: Option<(u64, u64)>,
    /// Wholly free segments released (address, size) before reserving the new one.
    pub released: usize,
}

/// A failed `malloc`: what PyTorch's OOM message reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    pub request: u64,
    pub reserved: u64,
    pub allocated: u64,
    /// Largest cached free block.
    pub largest_free: u64,
}

#[derive(Clone, Debug)]
pub struct CachingAllocator {
    segments: Vec<Segment>,
    next_addr: u64,
    /// Bytes the allocator may reserve on its device (device memory minus the context and
    /// everyone else's).
    capacity: u64,
    allocated: u64,
    reserved: u64,
    /// Segments released by `release_cached_blocks`, drained by the caller.
    released_log: Vec<(u64, u64)>,
}

impl CachingAllocator {
    pub fn new(base_addr: u64, capacity: u64) -> Self {
        Self {
            segments: Vec::new(),
            next_addr: base_addr,
            capacity,
            allocated: 0,
            reserved: 0,
            released_log: Vec::new(),
        }
    }

    pub const fn allocated(&self) -> u64 {
        self.allocated
    }

    pub const fn capacity(&self) -> u64 {
        self.capacity
    }

    pub const fn reserved(&self) -> u64 {
        self.reserved
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Segments released since the last call (address, size).
    pub fn take_released(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.released_log)
    }

    fn best_fit(&self, rounded: u64, small: bool) -> Option<(usize, u64, u64)> {
        let mut best: Option<(usize, u64, u64)> = None;
        for (i, s) in self.segments.iter().enumerate() {
            if s.small != small {
                continue;
            }
            for (&a, b) in &s.blocks {
                if !b.used && b.size >= rounded && best.is_none_or(|(_, _, sz)| b.size < sz) {
                    best = Some((i, a, b.size));
                }
            }
        }
        best
    }

    fn take_block(&mut self, seg: usize, addr: u64, rounded: u64) -> u64 {
        let s = &mut self.segments[seg];
        let Some(b) = s.blocks.get_mut(&addr) else {
            return 0;
        };
        let remaining = b.size - rounded;
        let split = if s.small {
            remaining >= MIN_BLOCK
        } else {
            remaining > SMALL_SIZE
        };
        b.used = true;
        if split {
            b.size = rounded;
            s.blocks.insert(
                addr + rounded,
                Block {
                    size: remaining,
                    used: false,
                },
            );
        }
        let size = s.blocks.get(&addr).map_or(0, |b| b.size);
        self.allocated += size;
        size
    }

    fn release_cached(&mut self) -> usize {
        let before = self.segments.len();
        let mut released = Vec::new();
        self.segments.retain(|s| {
            let free = s.blocks.len() == 1 && s.blocks.values().all(|b| !b.used);
            if free {
                released.push((s.addr, s.size));
            }
            !free
        });
        for (_, size) in &released {
            self.reserved -= size;
        }
        self.released_log.extend(released);
        before - self.segments.len()
    }

    pub fn malloc(&mut self, request: u64) -> Result<Malloc, OutOfMemory> {
        let rounded = round_request(request);
        let small = rounded <= SMALL_SIZE;
        if let Some((seg, addr, _)) = self.best_fit(rounded, small) {
            let block_bytes = self.take_block(seg, addr, rounded);
            return Ok(Malloc {
                addr,
                block_bytes,
                new_segment: None,
                released: 0,
            });
        }
        let size = segment_size(rounded);
        let mut released = 0;
        if self.reserved + size > self.capacity {
            released = self.release_cached();
            if self.reserved + size > self.capacity {
                return Err(OutOfMemory {
                    request,
                    reserved: self.reserved,
                    allocated: self.allocated,
                    largest_free: self.largest_free(),
                });
            }
        }
        let addr = self.next_addr;
        self.next_addr += size.div_ceil(ROUND_LARGE) * ROUND_LARGE;
        let mut blocks = BTreeMap::new();
        blocks.insert(addr, Block { size, used: false });
        self.segments.push(Segment {
            addr,
            size,
            small,
            blocks,
        });
        self.reserved += size;
        let seg = self.segments.len() - 1;
        let block_bytes = self.take_block(seg, addr, rounded);
        Ok(Malloc {
            addr,
            block_bytes,
            new_segment: Some((addr, size)),
            released,
        })
    }

    /// Frees the block at `addr`; returns its size (0 when no such block is in use).
    pub fn free(&mut self, addr: u64) -> u64 {
        let Some(s) = self
            .segments
            .iter_mut()
            .find(|s| addr >= s.addr && addr < s.addr + s.size)
        else {
            return 0;
        };
        let Some(b) = s.blocks.get_mut(&addr) else {
            return 0;
        };
        if !b.used {
            return 0;
        }
        b.used = false;
        let size = b.size;
        self.allocated -= size;
        // Merge with the next and the previous block when they are free.
        let mut start = addr;
        let mut total = size;
        if let Some(next) = s.blocks.get(&(addr + size)).cloned()
            && !next.used
        {
            s.blocks.remove(&(addr + size));
            total += next.size;
        }
        if let Some((&pa, pb)) = s.blocks.range(..addr).next_back()
            && !pb.used
            && pa + pb.size == addr
        {
            start = pa;
            total += pb.size;
            s.blocks.remove(&addr);
        }
        s.blocks.insert(
            start,
            Block {
                size: total,
                used: false,
            },
        );
        size
    }

    /// The largest cached free block.
    pub fn largest_free(&self) -> u64 {
        self.segments
            .iter()
            .flat_map(|s| s.blocks.values())
            .filter(|b| !b.used)
            .map(|b| b.size)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_splits_and_caches_like_pytorch() {
        let mut a = CachingAllocator::new(0x7f00_0000_0000, 80 * GIB);
        // A 4-byte scalar takes a 512 B block from a fresh 2 MiB small segment.
        let m = a.malloc(4).expect("fits");
        assert_eq!(m.block_bytes, 512);
        assert_eq!(m.new_segment.map(|s| s.1), Some(2 * MIB));
        // 9.5 MiB from a 20 MiB segment leaves 10.5 MiB (split); the next 9.8 MiB leaves
        // 0.7 MiB, which is not split: the block is 10.5 MiB.
        let b = a.malloc(9 * MIB + 512 * KIB).expect("fits");
        assert_eq!(b.new_segment.map(|s| s.1), Some(20 * MIB));
        let c = a.malloc(9 * MIB + 800 * KIB).expect("fits");
        assert_eq!(c.new_segment, None);
        assert_eq!(c.block_bytes, 10 * MIB + 512 * KIB);
        assert_eq!(a.reserved(), 22 * MIB);
        // Freed blocks are cached: the reserve stays, and the block is reused.
        a.free(b.addr);
        let d = a.malloc(9 * MIB).expect("fits");
        assert_eq!(d.addr, b.addr);
        assert_eq!(a.reserved(), 22 * MIB);
        // A 29 MiB request gets a dedicated segment rounded to 2 MiB; the remainder (just
        // under 1 MiB) is not split off, so the block is the whole 30 MiB segment.
        let e = a.malloc(29 * MIB + 1).expect("fits");
        assert_eq!(e.new_segment.map(|s| s.1), Some(30 * MIB));
        assert_eq!(e.block_bytes, 30 * MIB);
        let f = a.malloc(27 * MIB).expect("fits");
        assert_eq!(f.new_segment.map(|s| s.1), Some(28 * MIB));
        assert_eq!(f.block_bytes, 28 * MIB);
        let g = a.malloc(26 * MIB + 512).expect("fits");
        assert_eq!(g.new_segment.map(|s| s.1), Some(28 * MIB));
        assert_eq!(
            g.block_bytes,
            26 * MIB + 512,
            "a 1.5 MiB remainder is split off"
        );
    }

    #[test]
    fn releases_free_segments_before_failing() {
        let mut a = CachingAllocator::new(0x7f00_0000_0000, 64 * MIB);
        let x = a.malloc(40 * MIB).expect("fits");
        a.free(x.addr);
        // 40 MiB cached + 40 MiB new would exceed 64: the free segment is released first.
        let y = a.malloc(50 * MIB).expect("fits after release");
        assert_eq!(y.released, 1);
        assert_eq!(a.take_released(), vec![(x.addr, 40 * MIB)]);
        let err = a.malloc(20 * MIB).expect_err("no room");
        assert_eq!(err.reserved, 50 * MIB);
    }
}

#[cfg(test)]
mod real_snapshot {
    use super::*;

    /// Replaying the real H100 snapshot's history (PyTorch 2.11, `analysis-core/tests/assets/
    /// torch/real-torch.pickle`) through the model gives the reserve, allocated and peak bytes
    /// PyTorch itself reported at the end (`real-torch.expected.json`) and the snapshot's segments.
    #[test]
    fn replays_the_real_snapshot_to_pytorchs_own_numbers() {
        let bytes =
            include_bytes!("../../../../analysis-core/tests/assets/torch/real-torch.pickle");
        let (trace, _) = analysis_core::torch_snapshot::load(bytes).expect("imports");
        let m = &trace.model;
        // Events in time order: frees before allocations at the same time.
        let mut ev: Vec<(u64, u8, usize)> = Vec::new();
        for (i, a) in m.allocs.iter().enumerate() {
            ev.push((a.ts_nanos, 1, i));
            if !a.is_live() {
                ev.push((a.free_ts_nanos, 0, i));
            }
        }
        ev.sort_unstable();
        let mut model = CachingAllocator::new(0x7f00_0000_0000, 80 * GIB);
        let mut addr = std::collections::HashMap::new();
        let mut peak = 0;
        for (_, what, i) in ev {
            if what == 1 {
                let got = model.malloc(m.allocs.at(i).size_bytes).expect("fits");
                addr.insert(i, got.addr);
                peak = peak.max(model.allocated());
            } else if let Some(a) = addr.remove(&i) {
                model.free(a);
            }
        }
        assert_eq!(model.allocated(), 102_796_288, "memory_allocated()");
        assert_eq!(model.reserved(), 163_577_856, "memory_reserved()");
        assert_eq!(peak, 140_566_016, "max_memory_allocated()");
        // The snapshot's own segments: four 2 MiB small ones, and 16, 16, 16, 16, 20, 32, 32 MiB.
        let mut sizes: Vec<u64> = model.segments().iter().map(|s| s.size / MIB).collect();
        sizes.sort_unstable();
        assert_eq!(sizes, [2, 2, 2, 2, 16, 16, 16, 16, 20, 32, 32]);
    }
}
