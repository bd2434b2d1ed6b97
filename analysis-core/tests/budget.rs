//! A budget per input byte for every reader: on hostile inputs built to amplify (one warning per
//! byte, ...), heap use stays within `8 × input + 64 MiB` (FORMAT.md, "Robustness"), enforced by
//! a counting allocator that fails any allocation past the budget (the test then aborts).
//!
//! Its own test binary: the allocator's cap is process-wide, so no unrelated test shares it.

use std::alloc::System;
use std::sync::Mutex;

use analysis_core::msgpack::{write_array_len, write_str, write_uint};
use analysis_core::*;
use cap::Cap;

#[global_allocator]
static HEAP: Cap<System> = Cap::new(System, usize::MAX);
/// Tests measuring memory run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The budget of a reader given `input_len` bytes (FORMAT.md, "Robustness").
fn budget(input_len: usize) -> usize {
    8 * input_len + 64 * 1024 * 1024
}

/// Runs `f` with a heap budget of [`budget`]`(input_len)` above what is in use now.
fn bounded<T>(input_len: usize, f: impl FnOnce() -> T) -> T {
    let limit = HEAP.allocated() + budget(input_len);
    HEAP.set_limit(limit).expect("limit above current use");
    let r = f();
    HEAP.set_limit(usize::MAX).expect("unlimited");
    r
}

fn header() -> Vec<u8> {
    let mut out = Vec::new();
    write_array_len(&mut out, 4);
    write_str(&mut out, MAGIC);
    write_uint(&mut out, 1);
    write_uint(&mut out, 0);
    out.push(0x80);
    out
}

/// A valid header, then 4 MiB of MessagePack nils: each is a malformed record. One warning per
/// byte took ~390 bytes of memory per input byte; now the first of each kind are kept and the
/// rest counted.
#[test]
fn trace_of_nil_records_keeps_warnings_capped() {
    let _g = SERIAL.lock();
    let nils = 4 << 20;
    let mut bytes = header();
    bytes.resize(bytes.len() + nils, 0xc0);
    let t = bounded(bytes.len(), || load(&bytes)).expect("loads");
    let malformed = t
        .warnings
        .iter()
        .filter(|w| matches!(w, Warning::MalformedRecord { .. }))
        .count();
    assert_eq!(malformed, MAX_WARNINGS_PER_KIND);
    let more = t.warnings.iter().find_map(|w| match w {
        Warning::MoreWarnings {
            kind: "malformed_record",
            count,
        } => Some(*count),
        _ => None,
    });
    assert_eq!(more, Some((nils - MAX_WARNINGS_PER_KIND) as u64));
    assert!(
        t.warnings.len() <= 4 * MAX_WARNINGS_PER_KIND,
        "{}",
        t.warnings.len()
    );
    assert!(
        t.warnings
            .iter()
            .any(|w| w.to_string().contains("4194204 more malformed record")),
        "{:?}",
        t.warnings.last()
    );
}
