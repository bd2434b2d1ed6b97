//! How the history ends. A program that exited, a program that was killed or whose trace was
//! cut, and a snapshot of a running program are different things: memory live at the end of
//! an exit was not freed, while memory live in a snapshot or at a kill was simply in use. Only
//! an exit makes "never freed" a leak; in the others, leaks come from steady-state growth (and
//! from memory whose owner is gone, such as a thread that ended).

use crate::format::ProcessIdx;
use crate::model::TraceModel;
pub use crate::report::HistoryEnd;

impl HistoryEnd {
    /// Whether memory live at the end was left unfreed by a finished program.
    pub const fn program_finished(self) -> bool {
        matches!(self, Self::Exited)
    }

    pub const fn describe(self) -> &'static str {
        match self {
            Self::Exited => "the program exited",
            Self::Killed => "the program was killed",
            Self::Cut => "the trace ends without an end record (crash, kill or cut)",
            Self::Snapshot => "a snapshot of a running program",
        }
    }
}

/// Where the history of `process` ends: a snapshot for every process of a snapshot; else its
/// own `process_exit` (a signal: killed; an exit code: exited; neither: unknown, so cut); a
/// process without one ends with the trace (an `end` record: exited; none: cut).
pub fn end_of(m: &TraceModel, process: ProcessIdx) -> HistoryEnd {
    // The header's `ends_at` (format 1.2): a snapshot's history stops while the program runs.
    if m.header.ends_at == crate::format::TraceEnd::Snapshot {
        return HistoryEnd::Snapshot;
    }
    match m.process_exits.iter().rev().find(|e| e.process == process) {
        Some(e) if e.signal.is_some() => HistoryEnd::Killed,
        Some(e) if e.code.is_some() => HistoryEnd::Exited,
        Some(_) => HistoryEnd::Cut,
        None if m.clean_end => HistoryEnd::Exited,
        None => HistoryEnd::Cut,
    }
}

/// [`end_of`] for every process at once: the last exit record of each found in one pass.
pub fn ends_by_process(m: &TraceModel) -> impl Fn(ProcessIdx) -> HistoryEnd + '_ {
    let mut last: hashbrown::HashMap<ProcessIdx, &crate::format::ProcessExit> =
        hashbrown::HashMap::new();
    for e in &m.process_exits {
        last.insert(e.process, e);
    }
    move |process| {
        if m.header.ends_at == crate::format::TraceEnd::Snapshot {
            return HistoryEnd::Snapshot;
        }
        match last.get(&process) {
            Some(e) if e.signal.is_some() => HistoryEnd::Killed,
            Some(e) if e.code.is_some() => HistoryEnd::Exited,
            Some(_) => HistoryEnd::Cut,
            None if m.clean_end => HistoryEnd::Exited,
            None => HistoryEnd::Cut,
        }
    }
}

/// Where the traced program's history ends: that of its first (root) process.
pub fn classify(m: &TraceModel) -> HistoryEnd {
    end_of(m, m.processes.first().map_or(ProcessIdx(0), |p| p.process))
}
