//! The start of every iteration, in time order: a packed column ([`Column`]) that goes to the
//! model's spill with its history, rather than a vector of 8 bytes per iteration (7.7 M steps
//! of a 300M-event training trace had taken 62 MB).

use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::packed::{Column, ColumnIter, Spill};

/// Iteration starts, ascending; what [`super::Iterations`] spans are made of.
#[derive(Clone, Debug, Default)]
pub struct Starts {
    column: Column,
    /// Starts before this index are dropped (the column keeps them).
    from: usize,
}

impl Starts {
    /// The distinct `times` in order, kept in a column whose full chunks go to `spill` where
    /// it takes them. Times that ascend (every intact history's) go straight to the column; a
    /// time stepping back (a damaged history) has them all sorted in a vector first.
    pub fn collect(times: impl IntoIterator<Item = u64>, spill: Option<Arc<dyn Spill>>) -> Self {
        let mut column = Column::new();
        column.set_spill(spill.clone());
        let mut times = times.into_iter();
        while let Some(t) = times.next() {
            match column.last() {
                Some(last) if t == last => {}
                Some(last) if t < last => {
                    let mut all: Vec<u64> = column.iter_from(0).collect();
                    all.push(t);
                    all.extend(times);
                    all.sort_unstable();
                    all.dedup();
                    let mut column = Column::new();
                    column.set_spill(spill);
                    for t in all {
                        column.push_ascending(t);
                    }
                    return Self { column, from: 0 };
                }
                _ => column.push_ascending(t),
            }
        }
        Self { column, from: 0 }
    }

    /// Times that do not decrease, repeats kept (tests of spans that repeat a start).
    #[cfg(test)]
    pub(crate) fn with_repeats(times: &[u64]) -> Self {
        let mut column = Column::new();
        for &t in times {
            column.push_ascending(t);
        }
        Self { column, from: 0 }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.column.len() - self.from
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Start `i`, if there is one.
    #[inline]
    pub fn get(&self, i: usize) -> Option<u64> {
        (i < self.len()).then(|| self.column.get(self.from + i))
    }

    /// The number of starts satisfying `pred`, which holds for a prefix of them (as
    /// `slice::partition_point`).
    pub fn partition_point(&self, pred: impl FnMut(u64) -> bool) -> usize {
        self.column
            .partition_sorted(self.from, self.column.len(), pred)
            - self.from
    }

    /// Drops the first `n` starts.
    pub fn drop_front(&mut self, n: usize) {
        self.from += n.min(self.len());
    }

    /// The starts in order, a block decoded at a time.
    pub fn iter(&self) -> ColumnIter<'_> {
        self.column.iter_from(self.from)
    }

    /// The starts as a vector (tests).
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }
}

impl PartialEq for Starts {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Reads, searches and drops equal those of the sorted vector.
        #[test]
        fn starts_read_as_the_vector_does(
            gaps in proptest::collection::vec(0u64..1 << 40, 0..600),
            cut in 0usize..700,
            x in 0u64..1 << 45,
        ) {
            let times: Vec<u64> = gaps
                .iter()
                .scan(0u64, |at, g| {
                    *at += g;
                    Some(*at)
                })
                .collect();
            let mut s = Starts::collect(times.clone(), None);
            let mut want = times.clone();
            prop_assert_eq!(s.to_vec(), want.clone());
            s.drop_front(cut);
            want.drain(..cut.min(want.len()));
            prop_assert_eq!(s.len(), want.len());
            prop_assert_eq!(s.to_vec(), want.clone());
            for (i, &w) in want.iter().enumerate() {
                prop_assert_eq!(s.get(i), Some(w));
            }
            prop_assert_eq!(s.get(want.len()), None);
            prop_assert_eq!(s.partition_point(|t| t < x), want.partition_point(|&t| t < x));
            prop_assert_eq!(s.partition_point(|t| t <= x), want.partition_point(|&t| t <= x));
            prop_assert!(s == Starts::collect(want, None));
        }

        /// Any times give the distinct ones sorted, whether they ascend or step back.
        #[test]
        fn collected_starts_are_sorted_and_distinct(
            times in proptest::collection::vec(0u64..5_000, 0..400),
            ascending in any::<bool>(),
        ) {
            let mut times = times;
            if ascending {
                times.sort_unstable();
            }
            let mut want = times.clone();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(Starts::collect(times, None).to_vec(), want);
        }
    }
}
