//! Snapshot importer fuzz target: arbitrary bytes given as a PyTorch memory snapshot (pickle or
//! JSON) must never panic; whatever converts must decode as a trace and summarize; and pushed
//! into a `SnapshotLoader` in two pieces (cut at a point derived from the input), they must
//! give what loading them whole gives. Loading stays within the readers' memory budget
//! (`budget.rs`).
#![no_main]

mod budget;

use analysis_core::summarize;
use analysis_core::{load, torch_snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((trace, _)) = budget::bounded(data.len(), || torch_snapshot::convert(data)) {
        let loaded = load(&trace).expect("a converted snapshot is a valid trace");
        let _ = summarize(&loaded);
    }

    // The cut comes from the input's last bytes, so seeds (whole snapshots) stay as they are
    // and the fuzzer still explores every cut.
    let seed = data.iter().rev().take(8).fold(data.len() as u64, |h, &b| {
        h.wrapping_mul(31).wrapping_add(u64::from(b))
    });
    let cut = (seed % (data.len() as u64 + 1)) as usize;
    let (a, b) = data.split_at(cut);
    let pieces = budget::bounded(data.len(), || {
        let mut loader = torch_snapshot::SnapshotLoader::new(Some(data.len()));
        let pieces = loader.push(a).and_then(|()| loader.push(b));
        if pieces.is_ok() {
            assert_eq!(loader.bytes_read(), data.len() as u64);
        }
        pieces.and_then(|()| loader.finish())
    });
    let whole = budget::bounded(data.len(), || torch_snapshot::load(data));
    match (whole, pieces) {
        (Ok((w, ws)), Ok((p, ps))) => {
            assert_eq!(ws, ps, "import summaries differ for a cut at {cut}");
            assert_eq!(w.bytes, p.bytes);
            assert_eq!(
                summarize(&w),
                summarize(&p),
                "reports differ for a cut at {cut}"
            );
        }
        (Err(w), Err(p)) => assert_eq!(w, p, "errors differ for a cut at {cut}"),
        (w, p) => panic!(
            "whole: {:?}, in pieces cut at {cut}: {:?}",
            w.map(|x| x.1),
            p.map(|x| x.1)
        ),
    }
});
