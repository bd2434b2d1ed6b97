//! Pickle and JSON reader fuzz target: arbitrary bytes read as a pickle and as JSON, whole and
//! in two pieces (cut at a point derived from the input), never panic, give the same values or
//! the same error, and stay within the readers' memory budget (`budget.rs`).
#![no_main]

mod budget;

use std::fmt::Write;

use analysis_core::pickle::{JsonParser, Kind, Parser, Pickle, Value};
use libfuzzer_sys::fuzz_target;

/// The values under `v`, written out up to `left` of them (memo references can make a pickle's
/// tree exponentially large, and deep: `left` bounds the recursion too).
fn render(p: &Pickle, v: Value, left: &mut u32, out: &mut String) {
    if *left == 0 {
        out.push('~');
        return;
    }
    *left -= 1;
    match p.kind(v) {
        Kind::Str(_) => {
            let _ = write!(out, "{:?}", p.str(v));
        }
        Kind::Bytes(_) => {
            let _ = write!(out, "{:?}", p.bytes(v));
        }
        Kind::List(_) | Kind::Tuple(_) => {
            out.push('[');
            for &x in p.items(v) {
                render(p, x, left, out);
                out.push(',');
            }
            out.push(']');
        }
        Kind::Dict(_) => {
            out.push('{');
            for &(k, x) in p.entries(v) {
                render(p, k, left, out);
                out.push(':');
                render(p, x, left, out);
                out.push(',');
            }
            out.push('}');
        }
        k => {
            let _ = write!(out, "{k:?}");
        }
    }
}

fn rendered(p: &Pickle) -> String {
    let mut out = String::new();
    if let Some(root) = p.root {
        render(p, root, &mut 4096, &mut out);
    }
    out
}

fn same<E: PartialEq + std::fmt::Debug>(
    what: &str,
    whole: Result<Pickle, E>,
    pieces: Result<Pickle, E>,
    cut: usize,
) {
    match (whole, pieces) {
        (Ok(w), Ok(p)) => assert_eq!(rendered(&w), rendered(&p), "{what} cut at {cut}"),
        (Err(w), Err(p)) => assert_eq!(w, p, "{what} cut at {cut}"),
        (w, p) => panic!(
            "{what} whole: {:?}, in pieces cut at {cut}: {:?}",
            w.map(|p| rendered(&p)),
            p.map(|p| rendered(&p))
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    let seed = data.iter().rev().take(8).fold(data.len() as u64, |h, &b| {
        h.wrapping_mul(31).wrapping_add(u64::from(b))
    });
    let cut = (seed % (data.len() as u64 + 1)) as usize;
    let (a, b) = data.split_at(cut);

    let whole = budget::bounded(data.len(), || Pickle::parse(data));
    let pieces = budget::bounded(data.len(), || {
        let mut parser = Parser::incremental(data.len());
        let mut take = |_: &Pickle, _: &[Value]| None;
        parser.push(a)?;
        parser.advance(&mut take, false)?;
        parser.push(b)?;
        parser.advance(&mut take, true)?;
        Ok(parser.into_pickle())
    });
    same("pickle", whole, pieces, cut);

    let whole = budget::bounded(data.len(), || Pickle::from_json(data));
    let pieces = budget::bounded(data.len(), || {
        let mut parser = JsonParser::new();
        parser.push(a)?;
        parser.push(b)?;
        parser.finish()
    });
    same("json", whole, pieces, cut);
});
