//! The sizes of PyTorch's caching-allocator blocks. Its trace hook and its history give a
//! block's *request* (rounded up to 512 bytes by the shim and the history reader), while
//! `torch.cuda.memory_allocated()` counts whole blocks: a large-pool block (over 1 MiB) is cut
//! from a free block only when more than 1 MiB would remain (`should_split` in
//! CUDACachingAllocator.cpp), otherwise the request gets the whole free block. A block is cut
//! from the start of a free block, and free blocks merge with their free neighbours, so the free
//! block a request came from runs from its address to the next live block of its segment or the
//! segment's end. This module keeps that layout (the driver allocations a process made and the
//! live PyTorch blocks inside them) and gives each new block its whole size.
//!
//! Expandable segments (VMM mappings, no `cuMemAlloc` around the block) split any remainder, as
//! does the small pool (requests up to 1 MiB): their blocks stay at the rounded request. Not
//! modelled: `max_split_size_mb` (blocks at or above it are never split) and
//! `roundup_power2_divisions`; a block freed while a side stream still used it leaves the layout
//! at once (PyTorch keeps it until the stream is done), which can only make a free block look
//! larger, so a block is then counted at its rounded request. In the history fallback, blocks
//! arrive when the history is read, in their order, so the blocks around one are those of its
//! time; a segment released (`empty_cache`) between a block's allocation and the read is gone
//! by then, and that block keeps its rounded request.

use std::collections::{BTreeMap, HashSet};

use analysis_core::format::{DeviceIdx, ProcessIdx};

/// The largest request of the small pool (`kSmallSize`), and the most a large block may leave
/// unsplit.
const SMALL_MAX: u64 = 1 << 20;

/// Only processes with PyTorch blocks are followed: the collector's drain pays for the layout
/// there alone, not for every `cuMemAlloc` of every program.
#[derive(Default)]
pub(crate) struct BlockLayout {
    /// Processes followed (from their first PyTorch block on).
    followed: HashSet<ProcessIdx>,
    /// Driver allocations by (process, start): (device, end).
    segments: BTreeMap<(ProcessIdx, u64), (DeviceIdx, u64)>,
    /// Live PyTorch blocks by (process, device, start): end.
    blocks: BTreeMap<(ProcessIdx, DeviceIdx, u64), u64>,
}

impl BlockLayout {
    /// Whether `process` is followed (has had a PyTorch block).
    pub fn tracks(&self, process: ProcessIdx) -> bool {
        self.followed.contains(&process)
    }

    /// Follows `process` from now on, starting from its live driver allocations
    /// `(device, address, size)`.
    pub fn start(
        &mut self,
        process: ProcessIdx,
        live: impl IntoIterator<Item = (DeviceIdx, u64, u64)>,
    ) {
        self.followed.insert(process);
        for (device, addr, size) in live {
            self.segment(process, device, addr, size);
        }
    }

    /// A driver allocation (`cuMemAlloc`): a segment the caching allocator may cut blocks from.
    pub fn segment(&mut self, process: ProcessIdx, device: DeviceIdx, addr: u64, size: u64) {
        self.segments
            .insert((process, addr), (device, addr.saturating_add(size)));
    }

    /// A driver allocation was freed (or lost with its context).
    pub fn segment_freed(&mut self, process: ProcessIdx, addr: u64) {
        self.segments.remove(&(process, addr));
    }

    /// The whole size of a new PyTorch block of `rounded` bytes (its request rounded up to 512)
    /// at `addr`, which from now on is live.
    pub fn block(
        &mut self,
        process: ProcessIdx,
        device: DeviceIdx,
        addr: u64,
        rounded: u64,
    ) -> u64 {
        let size = self.whole(process, device, addr, rounded);
        self.blocks
            .insert((process, device, addr), addr.saturating_add(size));
        size
    }

    /// A PyTorch block went back to the cache.
    pub fn block_freed(&mut self, process: ProcessIdx, device: DeviceIdx, addr: u64) {
        self.blocks.remove(&(process, device, addr));
    }

    /// Forgets what a context teardown released.
    pub fn reset(&mut self, process: ProcessIdx, device: DeviceIdx) {
        self.segments
            .retain(|&(p, _), &mut (d, _)| !(p == process && d == device));
        self.blocks
            .retain(|&(p, d, _), _| !(p == process && d == device));
    }

    fn whole(&self, process: ProcessIdx, device: DeviceIdx, addr: u64, rounded: u64) -> u64 {
        if rounded <= SMALL_MAX {
            return rounded;
        }
        let Some((_, &(seg_device, seg_end))) = self
            .segments
            .range(..=(process, addr))
            .next_back()
            .filter(|((p, _), (_, end))| *p == process && addr < *end)
        else {
            return rounded;
        };
        if seg_device != device {
            return rounded;
        }
        let next = self
            .blocks
            .range((process, device, addr.saturating_add(1))..)
            .next()
            .filter(|((p, d, _), _)| *p == process && *d == device)
            .map_or(seg_end, |((_, _, start), _)| (*start).min(seg_end));
        let free = next.saturating_sub(addr);
        if free >= rounded && free - rounded <= SMALL_MAX {
            free
        } else {
            rounded
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const P: ProcessIdx = ProcessIdx(0);
    const D: DeviceIdx = DeviceIdx(0);

    #[test]
    fn a_large_block_takes_a_remainder_of_at_most_one_mib() {
        let mut l = BlockLayout::default();
        l.segment(P, D, 0x1000_0000, 20 * MIB);
        // 3 MiB from the start of a 20 MiB segment: 17 MiB remain, split off.
        assert_eq!(l.block(P, D, 0x1000_0000, 3 * MIB), 3 * MIB);
        // 16.5 MiB of the 17 MiB left: half a MiB would remain, the block is the whole 17 MiB.
        let b = 0x1000_0000 + 3 * MIB;
        assert_eq!(l.block(P, D, b, 33 * MIB / 2), 17 * MIB);
        // The first block freed, 2.5 MiB in its 3 MiB (bounded by the second block): whole.
        l.block_freed(P, D, 0x1000_0000);
        assert_eq!(l.block(P, D, 0x1000_0000, 5 * MIB / 2), 3 * MIB);
    }

    #[test]
    fn small_blocks_other_devices_and_unknown_memory_keep_the_rounded_request() {
        let mut l = BlockLayout::default();
        l.segment(P, D, 0x1000_0000, 2 * MIB);
        // The small pool splits any remainder.
        assert_eq!(l.block(P, D, 0x1000_0000, 512 * 1024), 512 * 1024);
        // No segment around it (expandable segments map memory through VMM).
        assert_eq!(l.block(P, D, 0x9000_0000, 3 * MIB), 3 * MIB);
        // A segment of another process or device is not this block's.
        l.segment(ProcessIdx(1), D, 0x2000_0000, 4 * MIB);
        assert_eq!(l.block(P, D, 0x2000_0000, 3 * MIB), 3 * MIB);
        l.segment(P, DeviceIdx(1), 0x3000_0000, 4 * MIB);
        assert_eq!(l.block(P, D, 0x3000_0000, 3 * MIB), 3 * MIB);
        // Freed segments and a teardown are forgotten.
        l.segment(P, D, 0x4000_0000, 4 * MIB);
        l.segment_freed(P, 0x4000_0000);
        assert_eq!(l.block(P, D, 0x4000_0000, 3 * MIB), 3 * MIB);
        l.segment(P, D, 0x5000_0000, 4 * MIB);
        l.reset(P, D);
        assert_eq!(l.block(P, D, 0x5000_0000, 3 * MIB), 3 * MIB);
    }
}
