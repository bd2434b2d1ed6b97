//! Runs the accuracy corpus and fails on a regression against `baseline.json`: a scenario that
//! passed and now fails, or a lower precision or recall. Improvements print a note asking to
//! update the baseline (`cargo run -p gpucollect-accuracy --release -- table --write-baseline`).

use gpucollect_accuracy::score::{Baseline, compare};
use gpucollect_accuracy::{History, corpus, run};

#[test]
fn corpus_does_not_regress() {
    let scenarios = corpus::all();
    let outcomes: Vec<run::Outcome> = scenarios
        .iter()
        .map(|s| run::evaluate(s).unwrap_or_else(|e| panic!("{}: {e}", s.name)))
        .collect();
    let now = run::baseline(&outcomes);
    let base: Baseline =
        serde_json::from_str(include_str!("../baseline.json")).expect("baseline.json parses");
    let (worse, better) = compare(&base, &now);
    println!("{}", run::table(&outcomes));
    if !better.is_empty() {
        eprintln!(
            "note: the analysis improved on the corpus; update the baseline with\n  cargo run -p gpucollect-accuracy --release -- table --write-baseline\n{}",
            better.join("\n")
        );
    }
    assert!(
        worse.is_empty(),
        "the analysis regressed on the accuracy corpus:\n{}\n(run `cargo run -p gpucollect-accuracy --release -- table` for the table)",
        worse.join("\n")
    );
}

/// Every generated history loads without a fatal error or a damage warning (bad frees,
/// malformed records): the corpus itself is well formed.
#[test]
fn histories_are_well_formed() {
    for s in corpus::all() {
        let t = s
            .history
            .load()
            .unwrap_or_else(|e| panic!("{}: {e}", s.name));
        assert!(t.fatal.is_none(), "{}: {:?}", s.name, t.fatal);
        for w in &t.warnings {
            let text = w.to_string();
            assert!(
                !text.contains("bad") && !text.contains("malformed") && !text.contains("never"),
                "{}: {text}",
                s.name
            );
        }
        assert!(!s.history.is_empty());
        if matches!(s.history, History::Trace(_)) {
            assert!(t.model.allocs.len() > 100, "{}: too small", s.name);
        }
    }
}

/// The corpus is deterministic: two generations give the same bytes.
#[test]
fn corpus_is_deterministic() {
    let a = corpus::all();
    let b = corpus::all();
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.name, y.name);
        assert_eq!(x.truth, y.truth);
        match (&x.history, &y.history) {
            (History::Trace(p), History::Trace(q))
            | (History::Snapshot(p), History::Snapshot(q)) => {
                assert!(p == q, "{}: histories differ", x.name);
            }
            _ => panic!("{}: history kinds differ", x.name),
        }
    }
}

/// Names are unique and usable as file names (the peer export writes `<name>.json`).
#[test]
fn names_are_unique_file_names() {
    let mut seen = std::collections::HashSet::new();
    for s in corpus::all() {
        assert!(
            s.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "{}",
            s.name
        );
        assert!(seen.insert(s.name.clone()), "duplicate {}", s.name);
    }
}
