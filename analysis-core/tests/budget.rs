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

/// Runs `f` with the model's heap budget ([`model::model_budget`]) and the readers' 32 MiB
/// more (decoder buffers, warnings).
fn bounded_model<T>(input_len: usize, f: impl FnOnce() -> T) -> T {
    let limit = HEAP.allocated() + model::model_budget(input_len as u64) as usize + (32 << 20);
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

/// Writes pickles opcode by opcode (protocol 4), with every string and container memoized as
/// `pickle.dumps` does, so a test can share what it likes through the memo.
struct PickleWriter {
    out: Vec<u8>,
    memo: u32,
    keys: std::collections::HashMap<&'static str, u32>,
}

impl PickleWriter {
    fn new() -> Self {
        Self {
            out: vec![0x80, 4],
            memo: 0,
            keys: Default::default(),
        }
    }
    /// MEMOIZE: the key of what is on top of the stack.
    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo += 1;
        self.memo - 1
    }
    /// BINGET or LONG_BINGET.
    fn get(&mut self, key: u32) {
        match u8::try_from(key) {
            Ok(k) => self.out.extend_from_slice(&[b'h', k]),
            Err(_) => {
                self.out.push(b'j');
                self.out.extend_from_slice(&key.to_le_bytes());
            }
        }
    }
    /// A string, memoized the first time and referenced after.
    fn str(&mut self, s: &'static str) {
        if let Some(&k) = self.keys.get(s) {
            return self.get(k);
        }
        self.out.extend_from_slice(&[0x8c, s.len() as u8]);
        self.out.extend_from_slice(s.as_bytes());
        let k = self.memoize();
        self.keys.insert(s, k);
    }
    /// LONG1 of 8 bytes.
    fn int(&mut self, i: i64) {
        self.out.extend_from_slice(&[0x8a, 8]);
        self.out.extend_from_slice(&i.to_le_bytes());
    }
    fn op(&mut self, ops: &[u8]) {
        self.out.extend_from_slice(ops);
    }
    /// EMPTY_DICT MEMOIZE MARK (its key).
    fn dict(&mut self) -> u32 {
        self.op(b"}");
        let k = self.memoize();
        self.op(b"(");
        k
    }
    /// EMPTY_LIST MEMOIZE MARK (its key).
    fn list(&mut self) -> u32 {
        self.op(b"]");
        let k = self.memoize();
        self.op(b"(");
        k
    }
    fn finish(mut self) -> Vec<u8> {
        self.op(b".");
        self.out
    }
}

/// A block of a segment's `blocks`, allocated, at `addr`.
fn block(w: &mut PickleWriter, addr: i64) {
    w.dict();
    w.str("state");
    w.str("active_allocated");
    w.str("address");
    w.int(addr);
    w.str("size");
    w.int(512);
    w.op(b"u");
}

/// A snapshot whose `n` segments all name one memoized list of `n` blocks (8 KiB of pickle that
/// name `n²` blocks). Its segments repeat: 16 bytes of input name 2,000 blocks.
fn segments_sharing_one_block_list(n: i64) -> Vec<u8> {
    let mut w = PickleWriter::new();
    w.dict();
    w.str("device_traces");
    w.list();
    w.op(b"e");
    w.str("segments");
    w.list();
    let mut blocks = None;
    for s in 0..n {
        w.dict();
        w.str("device");
        w.int(0);
        w.str("address");
        w.int(s << 20);
        w.str("total_size");
        w.int(1 << 20);
        w.str("blocks");
        match blocks {
            Some(k) => w.get(k),
            None => {
                blocks = Some(w.list());
                for b in 0..n {
                    block(&mut w, b * 512);
                }
                w.op(b"e");
            }
        }
        w.op(b"u");
    }
    w.op(b"eu");
    w.finish()
}

/// An allocation of the history.
fn alloc_entry(w: &mut PickleWriter, addr: i64, time_us: i64) {
    w.dict();
    w.str("action");
    w.str("alloc");
    w.str("addr");
    w.int(addr);
    w.str("size");
    w.int(512);
    w.str("time_us");
    w.int(time_us);
    w.op(b"u");
}

/// A snapshot whose `n` device traces are all one memoized list of `n` allocations.
fn device_traces_sharing_one_list(n: i64) -> Vec<u8> {
    let mut w = PickleWriter::new();
    w.dict();
    w.str("segments");
    w.list();
    w.op(b"e");
    w.str("device_traces");
    w.list();
    let list = w.list();
    for i in 0..n {
        alloc_entry(&mut w, i * 512, i);
    }
    w.op(b"e");
    for _ in 1..n {
        w.get(list);
    }
    w.op(b"eu");
    w.finish()
}

/// A snapshot with one device trace naming one memoized allocation `n` times (5 bytes each).
fn one_entry_named_again_and_again(n: usize) -> Vec<u8> {
    let mut w = PickleWriter::new();
    w.dict();
    w.str("segments");
    w.list();
    w.op(b"e");
    w.str("device_traces");
    w.list();
    w.list();
    let entry = w.memo;
    alloc_entry(&mut w, 0, 0);
    for i in 1..n {
        w.get(entry);
        if i % 1000 == 0 {
            // Batches as pickle.dumps writes them.
            w.op(b"e(");
        }
    }
    w.op(b"eeu");
    w.finish()
}

fn import_bounded(bytes: &[u8]) -> Result<LoadedTrace, torch_snapshot::ImportError> {
    bounded(bytes.len(), || torch_snapshot::load(bytes).map(|(t, _)| t))
}

/// Memo references share, never copy: a snapshot whose segments all name one list of blocks
/// (8 KiB naming 4 million blocks took `report` 1.41 GB; a 24 KiB one aborted) is refused
/// with an error saying why, within the budget, whole and in pieces.
#[test]
fn a_pickle_memo_bomb_is_refused_within_the_budget() {
    let _g = SERIAL.lock();
    for (bytes, says) in [
        (segments_sharing_one_block_list(2000), "memo references"),
        (device_traces_sharing_one_list(2000), "memo references"),
        // 2 bytes per trace entry: more than the conversion takes from so few bytes.
        (one_entry_named_again_and_again(4 << 20), "per 32 bytes"),
    ] {
        let err = import_bounded(&bytes).expect_err("refused");
        assert!(err.to_string().contains(says), "{err}");
        let pieces = bounded(bytes.len(), || {
            let mut l = torch_snapshot::SnapshotLoader::new(None);
            for piece in bytes.chunks(64 * 1024) {
                l.push(piece)?;
            }
            l.finish()
        });
        assert_eq!(pieces.map(|(t, _)| t.model.allocs.len()).err(), Some(err));
    }
    // Sharing within the budget converts: a few segments naming one list.
    let t = import_bounded(&segments_sharing_one_block_list(8)).expect("converts");
    assert_eq!(t.model.allocs.len(), 8);
}

/// A snapshot with `extra` (a pickle value's opcodes, or JSON text) under a key of its root.
fn with_extra_pickle(extra: &[u8]) -> Vec<u8> {
    let mut w = PickleWriter::new();
    w.dict();
    w.str("segments");
    w.list();
    w.op(b"e");
    w.str("x");
    w.op(extra);
    w.op(b"u");
    w.finish()
}

fn with_extra_json(extra: &[u8]) -> Vec<u8> {
    let mut out = br#"{"segments": [], "x": "#.to_vec();
    out.extend_from_slice(extra);
    out.push(b'}');
    out
}

/// Pickles and JSON that are large in the ways that cost a reader: many one-byte values
/// (8 bytes each in the arena, and again on the stack: 32 MiB of Nones asked for 512 MiB at
/// once), many empty containers, one huge string, deep nesting. Each converts (an empty
/// snapshot) or is refused with an error saying why, within the budget, whole and in pieces.
#[test]
fn pickle_and_json_readers_stay_within_the_budget() {
    let _g = SERIAL.lock();
    let n = 32 << 20;
    // What each gives: converts (None), or an error saying this.
    let mut cases: Vec<(&str, Vec<u8>, Option<&str>)> = Vec::new();
    // MARK, then a None per byte, in one LIST.
    let mut nones = vec![b'('];
    nones.resize(n, b'N');
    nones.push(b'l');
    cases.push((
        "pickle: 32M Nones in one list",
        with_extra_pickle(&nones),
        Some("packs more values"),
    ));
    // The same as pickle.dumps batches them: APPENDS every 1,000.
    let mut batched = b"](".to_vec();
    for i in 0..n {
        batched.push(b'N');
        if i % 1000 == 999 {
            batched.extend_from_slice(b"e(");
        }
    }
    batched.push(b'e');
    cases.push((
        "pickle: 32M Nones appended",
        with_extra_pickle(&batched),
        Some("packs more values"),
    ));
    // An empty list per byte, in one LIST.
    let mut lists = vec![b'('];
    lists.resize(n, b']');
    lists.push(b'l');
    cases.push((
        "pickle: 32M empty lists",
        with_extra_pickle(&lists),
        Some("packs more values"),
    ));
    // Empty dicts, memoized, each in the one before: nesting 8M deep.
    let mut nested = Vec::new();
    for _ in 0..n / 4 {
        nested.extend_from_slice(b"}\x94(\x8c\x00");
    }
    let mut deep = nested.clone();
    deep.resize(deep.len() + n / 4, b'u');
    deep.truncate(deep.len() - 1);
    cases.push((
        "pickle: dicts nested 8M deep",
        with_extra_pickle(&deep[..]),
        Some("packs more values"),
    ));
    // One 32 MiB string.
    let mut string = vec![0x8d];
    string.extend_from_slice(&(n as u64).to_le_bytes());
    string.resize(string.len() + n, b'x');
    cases.push(("pickle: a 32 MiB string", with_extra_pickle(&string), None));
    // JSON: many zeros, a huge string, nesting too deep.
    let mut zeros = b"[0".to_vec();
    while zeros.len() < n {
        zeros.extend_from_slice(b",0");
    }
    zeros.push(b']');
    cases.push((
        "json: 16M zeros",
        with_extra_json(&zeros),
        Some("packs more values"),
    ));
    let mut empties = b"[{}".to_vec();
    while empties.len() < n {
        empties.extend_from_slice(b",[]");
    }
    empties.push(b']');
    cases.push((
        "json: 10M empty containers",
        with_extra_json(&empties),
        Some("packs more values"),
    ));
    let mut s = vec![b'"'];
    s.resize(n, b'x');
    s.push(b'"');
    cases.push(("json: a 32 MiB string", with_extra_json(&s), None));
    cases.push((
        "json: nesting 32M deep",
        with_extra_json(&vec![b'['; n]),
        Some("recursion limit"),
    ));
    for (what, bytes, expected) in &cases {
        let whole = bounded(bytes.len(), || {
            torch_snapshot::load(bytes).map(|(t, _)| t.bytes)
        });
        match (&whole, expected) {
            (Ok(n), None) => assert_eq!(*n, bytes.len() as u64),
            (Err(e), Some(says)) => assert!(e.to_string().contains(says), "{what}: {e}"),
            _ => panic!("{what}: {whole:?}, expected {expected:?}"),
        }
        let pieces = bounded(bytes.len(), || {
            let mut l = torch_snapshot::SnapshotLoader::new(Some(bytes.len()));
            for piece in bytes.chunks(1 << 20) {
                l.push(piece)?;
            }
            l.finish().map(|(t, _)| t.bytes)
        });
        assert_eq!(pieces, whole, "{what}");
    }
}

/// Distinct trace entries as small as they come are refused: `{'action': 'alloc'}` in 7 bytes
/// (4 million: their compact entries, 40 bytes each, asked for 294 MB while parsing; now at
/// most one per 32 input bytes is kept compact, the rest stay dicts in the arena, which the
/// parser's heap limit counts), `{'action': 'alloc', 'addr': i, 'size': 1}` in 18 bytes (keys
/// through the memo; 2 million took over 8 times their bytes to convert). With a stream and a
/// time (37 bytes, still smaller than PyTorch's) they convert, within the budget.
#[test]
fn many_tiny_trace_entries_stay_within_the_budget() {
    let _g = SERIAL.lock();
    let tiny = |n: usize, padded: bool| {
        let mut w = PickleWriter::new();
        w.dict();
        w.str("segments");
        w.list();
        w.op(b"e");
        w.str("device_traces");
        w.list();
        w.list();
        alloc_entry(&mut w, 0, 0);
        w.str("stream"); // memoized for the entries below
        w.op(b"0");
        let [action, alloc, addr, size, time, stream] =
            ["action", "alloc", "addr", "size", "time_us", "stream"].map(|k| w.keys[k] as u8);
        for i in 1..n {
            let i = i as i32;
            w.op(&[
                b'}', b'(', b'h', action, b'h', alloc, b'h', size, b'K', 1, b'h', addr, b'J',
            ]);
            w.op(&(i * 512).to_le_bytes());
            if padded {
                w.op(&[b'h', time, b'J']);
                w.op(&i.to_le_bytes());
                w.op(&[b'h', stream, 0x8a, 8]);
                w.op(&u64::MAX.to_le_bytes());
            }
            w.op(b"u");
            if i % 1000 == 0 {
                w.op(b"e(");
            }
        }
        w.op(b"eeu");
        w.finish()
    };
    // The smallest a trace entry can be: `{'action': 'alloc'}` in 7 bytes, 4 million of them.
    let mut w = PickleWriter::new();
    w.dict();
    w.str("device_traces");
    w.list();
    w.list();
    w.dict();
    w.str("action");
    w.str("alloc");
    w.op(b"u");
    for i in 1..4 << 20 {
        w.op(&[
            b'}',
            b'(',
            b'h',
            w.keys["action"] as u8,
            b'h',
            w.keys["alloc"] as u8,
            b'u',
        ]);
        if i % 1000 == 0 {
            w.op(b"e(");
        }
    }
    w.op(b"eeu");
    let bytes = w.finish();
    let err = import_bounded(&bytes).expect_err("refused");
    assert!(
        err.to_string().contains("per 32 bytes") || err.to_string().contains("packs more"),
        "{err}"
    );
    let n = 2 << 20;
    let bytes = tiny(n, false);
    assert!(bytes.len() < 20 * n, "{}", bytes.len());
    let err = import_bounded(&bytes).expect_err("refused");
    assert!(err.to_string().contains("per 32 bytes"), "{err}");
    let bytes = tiny(n, true);
    assert!(bytes.len() < 40 * n, "{}", bytes.len());
    let t = import_bounded(&bytes).expect("converts");
    assert_eq!(t.model.allocs.len(), n);
}

/// Allocation records as small as they come (3 to 5 bytes: no size, a size, an address; never
/// freed) replay within the budget. The model kept a 56-byte record per allocation and one
/// 16-byte point of the total's timeline (about 24 times a 5-byte record); it now keeps each
/// allocation's fields packed by column (`alloc_store`) and the timeline's points packed the
/// same way, about 15 bytes for each of these.
#[test]
fn minimal_allocation_records_stay_within_the_budget() {
    let _g = SERIAL.lock();
    let n = 4_000_000;
    for rec in [
        &[0x92, 0x10, 0x00][..],
        &[0x93, 0x10, 0x00, 0x01],
        &[0x94, 0x10, 0x00, 0x01, 0x00],
    ] {
        let mut bytes = header();
        for _ in 0..n {
            bytes.extend_from_slice(rec);
        }
        let before = HEAP.allocated();
        let t = bounded(bytes.len(), || load(&bytes)).expect("loads");
        assert_eq!(t.model.allocs.len(), n);
        assert!(t.model.allocs.iter().all(|a| a.is_live()));
        // What the model keeps is within the multiple without the constant's help.
        let held = HEAP.allocated() - before;
        assert!(
            held <= 8 * bytes.len(),
            "{held} bytes held for {} of {}-byte records",
            bytes.len(),
            rec.len()
        );
    }
}

/// Device and pool samples as small as they come (3 bytes each) are stored by column
/// (`samples`): as structs they took 56 and 40 bytes each (300,000 device samples 37 times
/// their bytes, stopped by the budget); now 5 million of each load whole, in less than their
/// bytes.
#[test]
fn minimal_samples_load_whole_in_less_than_their_bytes() {
    let _g = SERIAL.lock();
    for (tag, what) in [(22u8, "device samples"), (23, "pool samples")] {
        let n = 5_000_000;
        let bytes = tiny_records(tag, n);
        let t = bounded_model(bytes.len(), || load(&bytes)).expect("loads");
        assert!(t.fatal.is_none(), "{what}: {:?}", t.fatal);
        let m = &t.model;
        assert_eq!(m.device_samples.len() + m.pool_samples.len(), n, "{what}");
        let held = m.device_samples.heap_bytes() + m.pool_samples.heap_bytes();
        assert!(
            held < bytes.len(),
            "{what}: {held} bytes for {}",
            bytes.len()
        );
    }
}

/// `n` records of tag `tag` with one field, 0 (`[tag, 0]`: 3 bytes each).
fn tiny_records(tag: u8, n: usize) -> Vec<u8> {
    let mut bytes = header();
    for _ in 0..n {
        bytes.extend_from_slice(&[0x92, tag, 0x00]);
    }
    bytes
}

/// Records far smaller than what the model keeps for them (a 3-byte failed allocation is a
/// 56-byte record, a 3-byte range begin never ended a range in the late table) stop the load
/// once the model passes its budget, 16 times the bytes read plus 32 MiB
/// (`model::model_budget`), with an error that says so, keeping what came before.
#[test]
fn records_that_cost_more_than_their_bytes_stop_the_load() {
    let _g = SERIAL.lock();
    for (tag, what) in [(18u8, "failed allocations"), (19, "range begins")] {
        let n = 5_000_000;
        let bytes = tiny_records(tag, n);
        let t = bounded_model(bytes.len(), || load(&bytes)).expect("loads");
        let Some(DecodeError::TooDense {
            offset,
            model_bytes,
            limit_bytes,
        }) = t.fatal.clone()
        else {
            panic!("{what}: {:?}", t.fatal);
        };
        assert!(model_bytes > limit_bytes, "{what}");
        assert!(offset < bytes.len() as u64, "{what}");
        assert_eq!(limit_bytes, model::model_budget(offset), "{what}");
        let kept = t.model.device_samples.len()
            + t.model.pool_samples.len()
            + t.model.failed.len()
            + t.model.ranges.len();
        assert!(kept > 100_000, "{what}: {kept} kept");
        let e = t.fatal.expect("fatal").to_string();
        assert!(
            e.contains("16 times its bytes") && e.contains("kept"),
            "{e}"
        );
    }
}

/// A context reset releases the live allocations of its process and device from a list kept
/// per (process, device), not by reading the whole history again: a reset after every
/// allocation read every allocation before it (quadratic: 200,000 pairs took minutes). What
/// it releases is unchanged: every live allocation of that process and device, and nothing of
/// others.
#[test]
fn context_resets_release_exactly_their_process_and_device() {
    let _g = SERIAL.lock();
    let mut bytes = header();
    // One allocation on device 1 of process 0, live throughout.
    bytes.extend_from_slice(&[0x97, 0x10, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01]);
    let pairs = 200_000;
    for _ in 0..pairs {
        // An allocation on device 0, then a reset of (process 0, device 0).
        bytes.extend_from_slice(&[0x94, 0x10, 0x01, 0x07, 0x01]);
        bytes.extend_from_slice(&[0x94, 0x1b, 0x01, 0x00, 0x00]);
    }
    let t = bounded(bytes.len(), || load(&bytes)).expect("loads");
    assert_eq!(t.fatal, None);
    let m = &t.model;
    assert_eq!(m.allocs.len(), pairs + 1);
    assert_eq!(m.resets.len(), pairs);
    assert!(
        m.resets
            .iter()
            .all(|r| r.freed_count == 1 && r.freed_bytes == 7)
    );
    assert!(
        m.allocs.at(0).is_live(),
        "the other device's allocation stays"
    );
    assert!(
        m.allocs
            .iter()
            .skip(1)
            .all(|a| a.free_kind == FreeKind::ContextTeardown && a.free_ts_nanos == a.ts_nanos + 1)
    );
}

/// NVTX ranges that never end: every range event folded the peaks of all the ranges open in
/// its process (quadratic: 50,000 took 2 s, 1 million did not finish in a minute). Past
/// `MAX_OPEN_RANGES` open at once, a range keeps its begin and end only, and one warning says
/// how many.
#[test]
fn ranges_past_the_open_limit_keep_begin_and_end_only() {
    let _g = SERIAL.lock();
    let n = 300_000usize;
    let mut bytes = header();
    for i in 0..n as u32 {
        // range_begin: dt 1, range id i, name 0, domain 0, thread 0, process 0
        bytes.extend_from_slice(&[0x93, 0x13, 0x01, 0xce]);
        bytes.extend_from_slice(&i.to_be_bytes());
    }
    // An allocation inside all of them, then the first and the last range end.
    bytes.extend_from_slice(&[0x94, 0x10, 0x01, 0x09, 0x01]);
    bytes.extend_from_slice(&[0x93, 0x14, 0x01, 0x00]);
    bytes.extend_from_slice(&[0x93, 0x14, 0x01, 0xce]);
    bytes.extend_from_slice(&(n as u32 - 1).to_be_bytes());
    let t = bounded_model(bytes.len(), || load(&bytes)).expect("loads");
    assert_eq!(t.fatal, None);
    let m = &t.model;
    assert_eq!(m.ranges.len(), n);
    let untracked = (n - model::MAX_OPEN_RANGES) as u64;
    assert!(
        t.warnings
            .contains(&Warning::UntrackedRanges { count: untracked }),
        "{:?}",
        t.warnings
    );
    let (first, last) = (
        m.ranges.get(0).expect("the first range"),
        m.ranges.get(n - 1).expect("the last range"),
    );
    assert_eq!((first.alloc_count, first.peak_bytes), (1, 9), "followed");
    assert_eq!(
        (last.alloc_count, last.peak_bytes),
        (0, 9),
        "begin and end only"
    );
    assert!(first.end_ts_nanos.is_some() && last.end_ts_nanos.is_some());
    assert!(
        m.ranges
            .get(1)
            .expect("the second range")
            .end_ts_nanos
            .is_none()
    );
}

/// Valid traces of a million allocations and more are read within the budget too (18 to 26
/// bytes per allocation as the synthetic workloads write them; every allocation is kept in the
/// model).
#[test]
fn valid_traces_load_within_the_budget() {
    let _g = SERIAL.lock();
    for scenario in [
        synth::Scenario::TrainingLeak,
        synth::Scenario::ShortLived,
        synth::Scenario::MultiDevice,
    ] {
        let (bytes, _) = synth::generate(scenario, 2_000_000, 1);
        let t = bounded(bytes.len(), || load(&bytes)).expect("loads");
        assert!(t.model.allocs.len() >= 1_000_000, "{scenario:?}");
    }
}
