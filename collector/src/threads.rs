//! The analysis' independent parts on two threads (`analysis_core::Join`): the core starts
//! none itself, so the front ends that may pass this.

/// Runs the second part on a scoped thread while the caller's runs the first.
pub struct Threads;

impl analysis_core::Join for Threads {
    fn join<A: Send, B: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> B + Send,
    ) -> (A, B) {
        std::thread::scope(|s| {
            let other = s.spawn(b);
            let first = a();
            // A panic there is the same bug it would be on this thread: carry it on.
            let second = other
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e));
            (first, second)
        })
    }
}

/// The full report, its independent detectors on two threads.
pub fn analyze(
    trace: &analysis_core::model::LoadedTrace,
    config: &analysis_core::Config,
) -> analysis_core::Report {
    analysis_core::analyze_with(trace, config, &Threads)
}

#[cfg(test)]
mod tests {
    use analysis_core::synth::{Scenario, generate};

    /// Two threads make the same report, byte for byte, as one: every scenario, whatever it
    /// finds (leaks and trends in one half, spikes, fragmentation and out-of-memory in the
    /// other, folded together after).
    #[test]
    fn two_threads_make_the_same_report() {
        for s in Scenario::ALL {
            let (bytes, _) = generate(s, 20_000, 7);
            let trace = analysis_core::load(&bytes).expect("synthetic trace loads");
            let config = analysis_core::Config::default();
            let one = serde_json::to_string(&analysis_core::analyze(&trace, &config));
            let two = serde_json::to_string(&super::analyze(&trace, &config));
            assert_eq!(one.expect("report"), two.expect("report"), "{}", s.name());
        }
    }
}
