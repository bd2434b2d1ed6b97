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

/// One record of almost [`MAX_RECORD_BYTES`] (an unknown record holding half a million
/// short strings) arriving in 64 KiB pieces. It was parsed again from its start on every piece:
/// quadratic work (8.6 s of CPU for 16 MiB). Now the decoder scans on from where the last piece
/// ended and parses the record once: work stays a small multiple of the input.
#[test]
fn a_record_cut_across_many_pushes_is_not_parsed_again() {
    let _g = SERIAL.lock();
    // Strings of 31 bytes: the count of entries is within the bytes present early on, so a
    // parse does not stop at the array's header but skips every entry present.
    let strings = (MAX_RECORD_BYTES - 64) / 32;
    let mut bytes = header();
    bytes.extend_from_slice(&[0x92, 0x63, 0xdd]);
    bytes.extend_from_slice(&(strings as u32).to_be_bytes());
    for _ in 0..strings {
        bytes.push(0xbf);
        bytes.extend_from_slice(&[b'x'; 31]);
    }
    bytes.extend_from_slice(&[0x92, 0x1a, 0x05]); // end
    let (examined, t) = bounded(bytes.len(), || {
        let mut l = Loader::new();
        for piece in bytes.chunks(64 * 1024) {
            l.push(piece).expect("decodes");
        }
        (l.bytes_examined(), l.finish().expect("loads"))
    });
    assert!(t.model.clean_end, "{:?}", t.warnings);
    assert!(
        examined <= 4 * bytes.len() as u64,
        "{examined} bytes examined for {} of input",
        bytes.len()
    );
}

/// A record over [`MAX_RECORD_BYTES`] stops decoding with an error saying so, keeping what came
/// before, instead of being buffered whole (20 uploads of a 50 MiB record took a server to
/// 0.93 GB).
#[test]
fn a_record_over_the_limit_is_refused() {
    let _g = SERIAL.lock();
    let mut bytes = header();
    bytes.extend_from_slice(&[0x92, 0x10, 0x01]); // alloc record before it, malformed
    let at = bytes.len() as u64;
    bytes.extend_from_slice(&[0x92, 0x63, 0xc6]);
    let n = MAX_RECORD_BYTES + 1024;
    bytes.extend_from_slice(&(n as u32).to_be_bytes());
    bytes.resize(bytes.len() + n, 0);
    let mut l = Loader::new();
    let mut err = None;
    for piece in bytes.chunks(1 << 20) {
        if let Err(e) = l.push(piece) {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("refused");
    assert_eq!(
        err,
        DecodeError::RecordTooLarge {
            offset: at,
            limit_bytes: MAX_RECORD_BYTES as u64
        }
    );
    assert!(err.to_string().contains("larger than"), "{err}");
    let t = l.finish().expect("header was read");
    assert_eq!(t.fatal, Some(err));
}
