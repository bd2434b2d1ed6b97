//! Decoder fuzz target: arbitrary bytes, pushed in arbitrary chunks, must never panic, must
//! decode the same records however they are chunked, and must replay and summarize; loading
//! them stays within the readers' memory budget (`budget.rs`).
#![no_main]

mod budget;

use analysis_core::decode::Decoder;
use analysis_core::model::Loader;
use analysis_core::summarize;
use libfuzzer_sys::fuzz_target;

/// Decodes with the given chunk size; returns the records' debug form and the warnings.
fn decode(data: &[u8], chunk: usize) -> (Vec<String>, usize) {
    let mut d = Decoder::new();
    let mut out = Vec::new();
    for c in data.chunks(chunk.max(1)) {
        d.push(c);
        while let Ok(Some(r)) = d.next_record() {
            out.push(format!("{r:?}"));
        }
    }
    let warnings = d.finish().map(|w| w.len()).unwrap_or(0);
    (out, warnings)
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks a chunk size, so the fuzzer explores record-boundary splits.
    let (chunk, body) = match data.split_first() {
        Some((&c, rest)) => (usize::from(c) + 1, rest),
        None => (1, data),
    };
    let (whole, _) = decode(body, body.len().max(1));
    let (chunked, _) = decode(body, chunk);
    assert_eq!(whole, chunked, "chunking changed the decoded records");

    let loaded = budget::bounded(body.len(), || {
        let mut l = Loader::new();
        for c in body.chunks(chunk) {
            if l.push(c).is_err() {
                break;
            }
        }
        l.finish()
    });
    if let Ok(t) = loaded {
        let _ = summarize(&t);
    }
});
