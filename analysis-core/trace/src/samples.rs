//! The device and pool samples of a replayed trace, stored by column (`packed`): a capture
//! samples NVML and the pools every 50 ms by default, so a day-long run holds millions of each,
//! and a sample's fields change little from one to the next (the time by the interval, the
//! bytes by what moved). As structs they took 64 bytes per device sample plus a vector of its
//! processes, and 40 per pool sample, with a vector's doubling slack; by column, a few bytes
//! each (docs/benchmarks.md). Read back by index in O(1) and in either direction.

use alloc::vec::Vec;

use crate::format::{DeviceIdx, DeviceSample, PoolSample, ProcessIdx, ProcessUsage};
use crate::packed::Column;

/// The traits a store by column shares with a vector of its records: built from and
/// extended by records (pushed in order), compared and serialised as the sequence of them
/// (`iter()` in order, `push`, `new`, `len`).
macro_rules! sequence_traits {
    ($store:ty, $item:ty) => {
        impl Extend<$item> for $store {
            fn extend<I: IntoIterator<Item = $item>>(&mut self, iter: I) {
                for x in iter {
                    self.push(x);
                }
            }
        }

        impl FromIterator<$item> for $store {
            fn from_iter<I: IntoIterator<Item = $item>>(iter: I) -> Self {
                let mut s = Self::new();
                s.extend(iter);
                s
            }
        }

        impl From<alloc::vec::Vec<$item>> for $store {
            fn from(v: alloc::vec::Vec<$item>) -> Self {
                v.into_iter().collect()
            }
        }

        impl PartialEq for $store {
            fn eq(&self, other: &Self) -> bool {
                self.len() == other.len() && self.iter().eq(other.iter())
            }
        }

        /// As the sequence of its records (as a vector of them would be).
        impl serde::Serialize for $store {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.iter())
            }
        }
    };
}
pub(crate) use sequence_traits;

/// What every store by column has that does not depend on its records: `new`, `len` and
/// `is_empty` (by its first column, `ts`, one value per record), `heap_bytes`, and `set_spill`
/// (every column's full chunks to the model's spill), with [`sequence_traits`] over `$item`.
macro_rules! column_store {
    ($store:ty, $item:ty, [$($col:ident),+ $(,)?]) => {
        impl $store {
            pub const fn new() -> Self {
                Self {
                    $($col: $crate::packed::Column::new(),)+
                }
            }

            #[inline]
            pub fn len(&self) -> usize {
                self.ts.len()
            }

            #[inline]
            pub fn is_empty(&self) -> bool {
                self.ts.is_empty()
            }

            /// Heap bytes held.
            pub fn heap_bytes(&self) -> usize {
                0 $(+ self.$col.heap_bytes())+
            }

            /// Full chunks of every column from now on go to `spill` where it takes them.
            pub fn set_spill(
                &mut self,
                spill: Option<alloc::sync::Arc<dyn $crate::packed::Spill>>,
            ) {
                $(self.$col.set_spill(spill.clone());)+
            }
        }

        $crate::samples::sequence_traits!($store, $item);
    };
}
pub(crate) use column_store;

/// Pool samples in the order they were added.
#[derive(Clone, Debug, Default)]
pub struct PoolSamples {
    ts: Column,
    device: Column,
    pool: Column,
    reserved: Column,
    used: Column,
    process: Column,
}

column_store!(
    PoolSamples,
    PoolSample,
    [ts, device, pool, reserved, used, process]
);

impl PoolSamples {
    pub fn push(&mut self, s: PoolSample) {
        self.ts.push(s.ts_nanos);
        self.device.push(u64::from(s.device.0));
        self.pool.push(s.pool);
        self.reserved.push(s.reserved_bytes);
        self.used.push(s.used_bytes);
        self.process.push(u64::from(s.process.0));
    }

    /// The sample at `i`.
    pub fn get(&self, i: usize) -> Option<PoolSample> {
        (i < self.len()).then(|| self.at(i))
    }

    /// The sample at `i < len()`.
    fn at(&self, i: usize) -> PoolSample {
        PoolSample {
            ts_nanos: self.ts.get(i),
            device: DeviceIdx(self.device.get(i) as u32),
            pool: self.pool.get(i),
            reserved_bytes: self.reserved.get(i),
            used_bytes: self.used.get(i),
            process: ProcessIdx(self.process.get(i) as u32),
        }
    }

    /// The samples in order (`.rev()` for the latest first).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = PoolSample> + ExactSizeIterator + '_ {
        (0..self.len()).map(|i| self.at(i))
    }
}

/// Device samples in the order they were added; each sample's processes in two columns of
/// their own, `processes_end` saying where each sample's end.
#[derive(Clone, Debug, Default)]
pub struct DeviceSamples {
    ts: Column,
    device: Column,
    total: Column,
    free: Column,
    used: Column,
    /// Per sample: the processes of it and every sample before it.
    processes_end: Column,
    pid: Column,
    process_used: Column,
}

column_store!(
    DeviceSamples,
    DeviceSample,
    [
        ts,
        device,
        total,
        free,
        used,
        processes_end,
        pid,
        process_used
    ]
);

impl DeviceSamples {
    pub fn push(&mut self, s: DeviceSample) {
        self.ts.push(s.ts_nanos);
        self.device.push(u64::from(s.device.0));
        self.total.push(s.total_bytes);
        self.free.push(s.free_bytes);
        self.used.push(s.used_bytes);
        for p in &s.processes {
            self.pid.push(u64::from(p.pid));
            self.process_used.push(p.used_bytes);
        }
        self.processes_end.push(self.pid.len() as u64);
    }

    /// The processes of sample `i`, as indices into `pid` and `process_used`.
    fn processes_of(&self, i: usize) -> core::ops::Range<usize> {
        let start = match i.checked_sub(1) {
            Some(p) => self.processes_end.get(p) as usize,
            None => 0,
        };
        start..self.processes_end.get(i) as usize
    }

    /// The sample at `i`, its processes read back into a vector.
    pub fn get(&self, i: usize) -> Option<DeviceSample> {
        (i < self.len()).then(|| self.at(i))
    }

    /// The sample at `i < len()`.
    fn at(&self, i: usize) -> DeviceSample {
        DeviceSample {
            processes: self
                .processes_of(i)
                .map(|k| ProcessUsage {
                    pid: self.pid.get(k) as u32,
                    used_bytes: self.process_used.get(k),
                })
                .collect(),
            ..self.fixed(i)
        }
    }

    /// The sample at `i` without its processes (an empty vector): what most readers need, at
    /// no allocation.
    pub fn get_fixed(&self, i: usize) -> Option<DeviceSample> {
        (i < self.len()).then(|| self.fixed(i))
    }

    fn fixed(&self, i: usize) -> DeviceSample {
        DeviceSample {
            ts_nanos: self.ts.get(i),
            device: DeviceIdx(self.device.get(i) as u32),
            total_bytes: self.total.get(i),
            free_bytes: self.free.get(i),
            used_bytes: self.used.get(i),
            processes: Vec::new(),
        }
    }

    /// The samples in order, with their processes (`.rev()` for the latest first).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = DeviceSample> + ExactSizeIterator + '_ {
        (0..self.len()).map(|i| self.at(i))
    }

    /// The samples in order without their processes ([`Self::get_fixed`]).
    pub fn iter_fixed(
        &self,
    ) -> impl DoubleEndedIterator<Item = DeviceSample> + ExactSizeIterator + '_ {
        (0..self.len()).map(|i| self.fixed(i))
    }

    /// The latest sample whose fixed fields satisfy `pred`, with its processes.
    pub fn last_where(&self, mut pred: impl FnMut(&DeviceSample) -> bool) -> Option<DeviceSample> {
        let i = (0..self.len()).rev().find(|&i| pred(&self.fixed(i)))?;
        Some(self.at(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = u64> {
        // Alike values (as a capture's are) and any values (as a hostile trace's may be).
        prop_oneof![0u64..1 << 20, any::<u64>()]
    }

    fn device_sample() -> impl Strategy<Value = DeviceSample> {
        (
            (value(), any::<u32>(), value(), value(), value()),
            prop::collection::vec((any::<u32>(), value()), 0..4),
        )
            .prop_map(|((ts, device, total, free, used), procs)| DeviceSample {
                ts_nanos: ts,
                device: DeviceIdx(device),
                total_bytes: total,
                free_bytes: free,
                used_bytes: used,
                processes: procs
                    .into_iter()
                    .map(|(pid, used_bytes)| ProcessUsage { pid, used_bytes })
                    .collect(),
            })
    }

    fn pool_sample() -> impl Strategy<Value = PoolSample> {
        (
            value(),
            any::<u32>(),
            value(),
            value(),
            value(),
            any::<u32>(),
        )
            .prop_map(|(ts, device, pool, reserved, used, process)| PoolSample {
                ts_nanos: ts,
                device: DeviceIdx(device),
                pool,
                reserved_bytes: reserved,
                used_bytes: used,
                process: ProcessIdx(process),
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Samples read back as pushed, by index, forwards and backwards, across whole blocks
        /// and a partial one.
        #[test]
        fn samples_read_back_as_pushed(
            ds in prop::collection::vec(device_sample(), 0..300),
            ps in prop::collection::vec(pool_sample(), 0..300),
        ) {
            let d: DeviceSamples = ds.iter().cloned().collect();
            prop_assert_eq!(d.len(), ds.len());
            prop_assert_eq!(d.iter().collect::<Vec<_>>(), ds.clone());
            prop_assert_eq!(d.iter().rev().collect::<Vec<_>>(), ds.iter().rev().cloned().collect::<Vec<_>>());
            for (i, s) in ds.iter().enumerate() {
                prop_assert_eq!(d.get_fixed(i), Some(DeviceSample { processes: Vec::new(), ..s.clone() }));
            }
            prop_assert_eq!(d.get(ds.len()), None);
            let p: PoolSamples = ps.iter().copied().collect();
            prop_assert_eq!(p.iter().collect::<Vec<_>>(), ps.clone());
            prop_assert_eq!(p.iter().rev().collect::<Vec<_>>(), ps.iter().rev().copied().collect::<Vec<_>>());
            prop_assert_eq!(p.get(ps.len()), None);
        }
    }

    /// A day of samples every 50 ms packs to a few bytes each.
    #[test]
    fn regular_samples_pack_small() {
        let mut d = DeviceSamples::new();
        let mut p = PoolSamples::new();
        let n = 100_000u64;
        for k in 0..n {
            let used = (20 << 30) + (k % 1000) * 4096;
            d.push(DeviceSample {
                ts_nanos: k * 50_000_000,
                device: DeviceIdx(0),
                total_bytes: 80 << 30,
                free_bytes: (80 << 30) - used,
                used_bytes: used,
                processes: alloc::vec![ProcessUsage {
                    pid: 4242,
                    used_bytes: used
                }],
            });
            p.push(PoolSample {
                ts_nanos: k * 50_000_000,
                device: DeviceIdx(0),
                pool: 0,
                reserved_bytes: 24 << 30,
                used_bytes: used,
                process: ProcessIdx(0),
            });
        }
        let per = |b: usize| b as f64 / n as f64;
        assert!(
            per(d.heap_bytes()) < 24.0,
            "{} bytes per device sample",
            per(d.heap_bytes())
        );
        assert!(
            per(p.heap_bytes()) < 12.0,
            "{} bytes per pool sample",
            per(p.heap_bytes())
        );
    }
}
