//! A load split in two halves (`split_load`: decoding on one thread, replaying on another, and
//! the model finished on two, as `gpucollect report` does it) builds the same model as the
//! fused `Loader`, however the input is cut, damaged or stopped.

mod common;

use analysis_core::model::{Loader, model_budget};
use analysis_core::split_load::{Decoded, LoadDecoder, LoadReplay};
use analysis_core::synth::{Scenario, generate};
use analysis_core::{DecodeError, Join, LoadedTrace, summarize};
use common::model_digest;
use proptest::prelude::*;

/// `bytes` through the fused loader, pushed in pieces of the given sizes (cycled); `None`
/// when not even a header could be read.
fn fused(bytes: &[u8], cuts: &[usize]) -> Option<LoadedTrace> {
    let mut l = Loader::new();
    for piece in pieces(bytes, cuts) {
        if l.push(piece).is_err() {
            break;
        }
    }
    l.finish().ok()
}

/// The same through the two halves, a batch per piece, as a front end passes them between
/// threads.
fn split(bytes: &[u8], cuts: &[usize]) -> Option<LoadedTrace> {
    let mut decoder = LoadDecoder::new();
    let mut replay = LoadReplay::new();
    let mut batch = Decoded::default();
    for piece in pieces(bytes, cuts) {
        let decoded = decoder.push(piece, &mut batch);
        let replayed = replay.replay(&mut batch);
        assert!(batch.is_empty(), "a replayed batch is emptied");
        if decoded.is_err() || replayed.is_err() {
            break;
        }
    }
    replay.finish_with(decoder, &OnTwoThreads).ok()
}

/// Runs the second part on a scoped thread while the caller's runs the first, as `gpucollect
/// report` finishes a split load's model.
struct OnTwoThreads;

impl Join for OnTwoThreads {
    fn join<A: Send, B: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> B + Send,
    ) -> (A, B) {
        std::thread::scope(|s| {
            let other = s.spawn(b);
            let first = a();
            (first, other.join().expect("the other part finishes"))
        })
    }
}

fn pieces<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    for &n in cuts.iter().cycle() {
        if at >= bytes.len() {
            break;
        }
        let end = (at + n.max(1)).min(bytes.len());
        out.push(&bytes[at..end]);
        at = end;
    }
    out
}

fn assert_same(bytes: &[u8], cuts: &[usize], what: &str) {
    let (a, b) = (
        fused(bytes, cuts).expect("a header"),
        split(bytes, cuts).expect("a header"),
    );
    assert_eq!(model_digest(&a), model_digest(&b), "{what}: models");
    assert_eq!(a.bytes, b.bytes, "{what}: bytes");
    assert_eq!(summarize(&a), summarize(&b), "{what}: reports");
}

#[test]
fn every_scenario_loads_the_same_split_or_fused() {
    for s in Scenario::ALL {
        let (bytes, _) = generate(s, 20_000, 7);
        assert_same(&bytes, &[bytes.len()], &format!("{s:?} whole"));
        assert_same(&bytes, &[65_536, 1, 4_093], &format!("{s:?} cut"));
    }
}

/// Records far smaller than what the model keeps for them stop both loads at the same record
/// with the same error (`budget.rs` has the rule). The split decoder may have decoded past the
/// stop; the model and the bytes counted stop where the fused load stops.
#[test]
fn a_load_stopped_by_the_budget_stops_at_the_same_record() {
    let mut bytes = common::every_record_kind();
    bytes.truncate(header_len(&bytes));
    for _ in 0..3_000_000 {
        // A failed allocation with one field: 3 bytes for a 56-byte record.
        bytes.extend_from_slice(&[0x92, 18, 0x00]);
    }
    let cuts = [1 << 20];
    let (a, b) = (
        fused(&bytes, &cuts).expect("a header"),
        split(&bytes, &cuts).expect("a header"),
    );
    let Some(DecodeError::TooDense { offset, .. }) = a.fatal.clone() else {
        panic!("stops: {:?}", a.fatal);
    };
    assert_eq!(b.fatal, a.fatal);
    assert_eq!((a.bytes, b.bytes), (offset, offset));
    assert!(offset < model_budget(offset) && offset < bytes.len() as u64);
    assert_eq!(a.model.failed.len(), b.model.failed.len());
    assert_eq!(a.model.records, b.model.records);
}

/// The length of the header that starts `bytes` (a trace with no records after it).
fn header_len(bytes: &[u8]) -> usize {
    (1..=bytes.len())
        .find(|&n| {
            let mut d = analysis_core::Decoder::new();
            d.push(&bytes[..n]);
            let _ = d.next_record();
            d.header().is_some()
        })
        .expect("a header")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Cut anywhere, truncated anywhere, with bytes overwritten anywhere: the same model, the
    /// same warnings and the same stopping error.
    #[test]
    fn damaged_traces_load_the_same_split_or_fused(
        scenario in 0..Scenario::ALL.len(),
        seed in 0u64..1000,
        cuts in proptest::collection::vec(1usize..5_000, 1..6),
        keep in 0.0f64..=1.0,
        damage in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..8),
    ) {
        let (mut bytes, _) = generate(Scenario::ALL[scenario], 3_000, seed);
        for (at, b) in damage {
            let i = (at * bytes.len() as f64) as usize;
            if let Some(x) = bytes.get_mut(i) {
                *x = b;
            }
        }
        bytes.truncate((keep * bytes.len() as f64) as usize);
        let (a, b) = (fused(&bytes, &cuts), split(&bytes, &cuts));
        prop_assert_eq!(a.is_some(), b.is_some());
        if let (Some(a), Some(b)) = (a, b) {
            prop_assert_eq!(model_digest(&a), model_digest(&b));
            prop_assert_eq!(a.bytes, b.bytes);
        }
    }
}
