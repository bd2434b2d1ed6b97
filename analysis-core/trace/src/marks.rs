//! The NVTX marks of a replayed trace, stored by column (`packed`): a program that marks
//! every step holds millions of them in a long run, and as structs they took 24 bytes each
//! with a vector's doubling slack; by column a time and a few bytes of names and thread. Read
//! back by index in O(1), in order by `iter`.

use crate::format::{Mark, ProcessIdx, StringId, ThreadIdx};
use crate::packed::Column;
use crate::samples::column_store;

/// Marks in the order they were recorded.
#[derive(Clone, Debug, Default)]
pub struct Marks {
    ts: Column,
    name: Column,
    domain: Column,
    thread: Column,
    process: Column,
}

column_store!(Marks, Mark, [ts, name, domain, thread, process]);

impl Marks {
    pub fn push(&mut self, m: Mark) {
        self.ts.push(m.ts_nanos);
        self.name.push(u64::from(m.name.0));
        self.domain.push(u64::from(m.domain.0));
        self.thread.push(u64::from(m.thread.0));
        self.process.push(u64::from(m.process.0));
    }

    /// The mark at `i`.
    pub fn get(&self, i: usize) -> Option<Mark> {
        (i < self.len()).then(|| self.at(i))
    }

    /// The mark at `i < len()`.
    fn at(&self, i: usize) -> Mark {
        Mark {
            ts_nanos: self.ts.get(i),
            name: StringId(self.name.get(i) as u32),
            domain: StringId(self.domain.get(i) as u32),
            thread: ThreadIdx(self.thread.get(i) as u32),
            process: ProcessIdx(self.process.get(i) as u32),
        }
    }

    /// The marks in order (`.rev()` for the latest first).
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Mark> + ExactSizeIterator + '_ {
        (0..self.len()).map(|i| self.at(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    proptest! {
        /// Marks read back as they were pushed, by index and in order.
        #[test]
        fn marks_round_trip(
            marks in proptest::collection::vec(
                (any::<u64>(), any::<u32>(), any::<u32>(), 0u32..8, 0u32..3),
                0..300,
            ),
        ) {
            let want: Vec<Mark> = marks
                .iter()
                .map(|&(ts_nanos, name, domain, thread, process)| Mark {
                    ts_nanos,
                    name: StringId(name),
                    domain: StringId(domain),
                    thread: ThreadIdx(thread),
                    process: ProcessIdx(process),
                })
                .collect();
            let store: Marks = want.iter().copied().collect();
            prop_assert_eq!(store.len(), want.len());
            prop_assert_eq!(store.iter().collect::<Vec<_>>(), want.clone());
            for (i, w) in want.iter().enumerate() {
                prop_assert_eq!(store.get(i), Some(*w));
            }
            prop_assert_eq!(store.get(want.len()), None);
            prop_assert!(store == Marks::from(want));
        }
    }
}
