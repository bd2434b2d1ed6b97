//! The two layers of a framework's memory (FORMAT.md, "Two layers"): the blocks a framework's
//! caching allocator hands out (allocation kind 7, its tensors) inside the reserve its driver
//! allocations (segments) hold.
//!
//! The driver layer is what the device holds; the framework layer is what the program uses.
//! Leaks, growth, spikes and attribution are questions about the program's use, so the analysis
//! reads a trace that has framework blocks through [`tensor_view`]: blocks counted as
//! device memory, the segments holding them out of the allocations and turned into the reserve
//! of the framework's pool (`pool_sample` records, reserved against allocated), exactly the shape
//! a PyTorch snapshot has when imported.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use crate::format::{AllocKind, DeviceIdx, PoolSample, ProcessIdx, pool};
use crate::model::{AllocRecord, Fields, TraceModel, alloc_events};

/// The model the analysis reads when the trace holds framework blocks (FORMAT.md, "Two
/// layers"); `None` when it holds none. In it, framework blocks are device memory (the
/// program's own allocations, at their Python lines), the driver allocations holding them
/// (the framework's segments) are out of every series (kind 255, "other"), and each
/// framework's reserve is its default pool's `pool_sample`s (reserved: live segments; used:
/// live blocks) unless the trace has its own. Series, totals, peaks, range and failure
/// figures are replayed anew from those allocations; everything else is as recorded.
pub fn tensor_view(m: &TraceModel) -> Option<TraceModel> {
    if m.allocated.is_empty() {
        return None;
    }
    let is_segment = framework_segments(m);
    let reserve = reserve_samples(m, &is_segment);
    // The clone shares the history's columns but for the kinds, rewritten here.
    let mut v = m.clone();
    v.allocs.map_kinds(|i, kind| {
        if is_segment.get(i).copied().unwrap_or(false) {
            AllocKind::Other
        } else if kind == AllocKind::FrameworkBlock {
            AllocKind::Device
        } else {
            kind
        }
    });
    if !reserve.is_empty() {
        let mut samples: Vec<PoolSample> = v.pool_samples.iter().chain(reserve).collect();
        samples.sort_by_key(|p| p.ts_nanos);
        v.pool_samples = samples.into_iter().collect();
    }
    v.replay_series();
    Some(v)
}

/// Samples of a synthesized reserve closer in time than this are coalesced, except where a
/// segment is allocated or freed (1 ms: a day-long trace gets at most 86 M samples per device,
/// a training step of a few ms a handful).
pub const RESERVE_SAMPLE_SPACING_NANOS: u64 = 1_000_000;

/// Which allocations are a framework's segments: driver allocations (device memory) that held a
/// framework block of the same process and device, by address, when the block was made. One
/// flag per entry of `m.allocs`.
pub fn framework_segments(m: &TraceModel) -> Vec<bool> {
    let mut is_segment = alloc::vec![false; m.allocs.len()];
    if !m
        .allocs
        .iter_fields(Fields::KIND)
        .any(|a| a.kind == AllocKind::FrameworkBlock)
    {
        return is_segment;
    }
    // Allocation and free events of device memory and blocks, in time order (an allocation
    // before a free at the same nanosecond, then in trace order).
    let events = alloc_events(&m.allocs, |_, a| {
        a.kind.is_device_memory() || a.kind == AllocKind::FrameworkBlock
    });
    // Live device memory by (process, device, address).
    let mut live: BTreeMap<(ProcessIdx, DeviceIdx, u64), u32> = BTreeMap::new();
    for (_, is_free, i) in events {
        let a = &m.allocs.at(i as usize);
        if a.kind.is_device_memory() {
            let key = (a.process, a.device, a.address);
            if is_free {
                if live.get(&key) == Some(&i) {
                    live.remove(&key);
                }
            } else {
                live.insert(key, i);
            }
        } else if !is_free {
            let holder = live
                .range((a.process, a.device, 0)..=(a.process, a.device, a.address))
                .next_back()
                .map(|(_, &s)| s)
                .filter(|&s| contains(&m.allocs.at(s as usize), a));
            if let Some(s) = holder {
                is_segment[s as usize] = true;
            }
        }
    }
    is_segment
}

/// Whether `segment`'s address range holds the start of `block`.
fn contains(segment: &AllocRecord, block: &AllocRecord) -> bool {
    block.address >= segment.address && block.address - segment.address < segment.size_bytes.max(1)
}

/// The reserve of each framework pool over time, from its segments and blocks, for every
/// (process, device) that has framework blocks and no `pool_sample` of its own for the default
/// pool: `reserved_bytes` the live segments, `used_bytes` the live blocks, sampled at every
/// segment event and at most every [`RESERVE_SAMPLE_SPACING_NANOS`] otherwise, and at the last
/// event. `is_segment` is [`framework_segments`]'s answer.
pub fn reserve_samples(m: &TraceModel, is_segment: &[bool]) -> Vec<PoolSample> {
    let sampled: Vec<(ProcessIdx, DeviceIdx)> = m
        .pool_samples
        .iter()
        .filter(|p| p.pool == pool::DEFAULT)
        .map(|p| (p.process, p.device))
        .collect();
    let events = alloc_events(&m.allocs, |i, a| {
        let layered =
            is_segment.get(i).copied().unwrap_or(false) || a.kind == AllocKind::FrameworkBlock;
        layered && !sampled.contains(&(a.process, a.device))
    });
    let mut pools: Vec<Reserve> = Vec::new();
    let mut out = Vec::new();
    for (t, is_free, i) in events {
        let a = &m.allocs.at(i as usize);
        let key = (a.process, a.device);
        let pi = match pools.iter().position(|p| p.key == key) {
            Some(pi) => pi,
            None => {
                pools.push(Reserve {
                    key,
                    reserved_bytes: 0,
                    used_bytes: 0,
                    last_sample_nanos: None,
                    last_event_nanos: t,
                });
                pools.len() - 1
            }
        };
        let p = &mut pools[pi];
        let segment = is_segment.get(i as usize).copied().unwrap_or(false);
        let bytes = if segment {
            &mut p.reserved_bytes
        } else {
            &mut p.used_bytes
        };
        *bytes = if is_free {
            bytes.saturating_sub(a.size_bytes)
        } else {
            bytes.saturating_add(a.size_bytes)
        };
        p.last_event_nanos = t;
        let due = segment
            || p.last_sample_nanos
                .is_none_or(|l| t >= l.saturating_add(RESERVE_SAMPLE_SPACING_NANOS));
        if due {
            p.sample(t, &mut out);
        }
    }
    // Each pool's state after its last event.
    for p in &mut pools {
        let t = p.last_event_nanos;
        p.sample(t, &mut out);
    }
    out.sort_by_key(|p| p.ts_nanos);
    out
}

/// A synthesized reserve while its samples are made.
struct Reserve {
    key: (ProcessIdx, DeviceIdx),
    reserved_bytes: u64,
    used_bytes: u64,
    last_sample_nanos: Option<u64>,
    last_event_nanos: u64,
}

impl Reserve {
    /// Samples the reserve at `t`; a sample of this pool at the same nanosecond is replaced.
    fn sample(&mut self, t: u64, out: &mut Vec<PoolSample>) {
        let (process, device) = self.key;
        if self.last_sample_nanos == Some(t)
            && let Some(last) = out
                .iter_mut()
                .rev()
                .find(|p| p.process == process && p.device == device)
        {
            last.reserved_bytes = self.reserved_bytes;
            last.used_bytes = self.used_bytes;
            return;
        }
        out.push(PoolSample {
            ts_nanos: t,
            device,
            pool: pool::DEFAULT,
            reserved_bytes: self.reserved_bytes,
            used_bytes: self.used_bytes,
            process,
        });
        self.last_sample_nanos = Some(t);
    }
}
