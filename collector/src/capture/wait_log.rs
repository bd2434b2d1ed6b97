//! When the program waited for the collector: the seconds of the run in which pushes found the
//! ring full, so a user (or the ring's endurance benchmark) can tie a slowdown to a moment.

/// The seconds kept, each with its waits; later seconds only add to the count of seconds.
const MAX_SECONDS: usize = 4096;
/// The seconds named in the summary.
const NAMED: usize = 8;

/// Waits per second of the run, from the running total the ring counts.
#[derive(Debug, Default)]
pub struct WaitLog {
    /// (second of the run, waits in it), in time order.
    seconds: Vec<(u64, u64)>,
    /// Seconds with waits beyond the ones kept.
    more_seconds: u64,
    /// The running total at the last note.
    seen: u64,
}

impl WaitLog {
    /// Notes the running total of waits `total` at `second` of the run (seconds never
    /// decrease).
    pub fn note(&mut self, second: u64, total: u64) {
        let new = total.saturating_sub(self.seen);
        self.seen = self.seen.max(total);
        if new == 0 {
            return;
        }
        let kept = self.seconds.len();
        match self.seconds.last_mut() {
            Some((s, n)) if *s == second => *n += new,
            _ if kept < MAX_SECONDS => self.seconds.push((second, new)),
            _ => self.more_seconds += 1,
        }
    }

    /// How many distinct seconds had waits.
    pub fn seconds_with_waits(&self) -> u64 {
        self.seconds.len() as u64 + self.more_seconds
    }

    /// " in 3 seconds of the run: at 12 s (2,000), ..." naming the seconds with the most
    /// waits, in time order; empty when there were none.
    pub fn summary(&self) -> String {
        if self.seconds.is_empty() {
            return String::new();
        }
        let mut most: Vec<(u64, u64)> = self.seconds.clone();
        most.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        most.truncate(NAMED);
        most.sort_unstable();
        let named: Vec<String> = most
            .iter()
            .map(|(s, n)| format!("at {s} s ({n})"))
            .collect();
        let n = self.seconds_with_waits();
        let which = if n as usize > named.len() {
            format!("the most {}", named.join(", "))
        } else {
            named.join(", ")
        };
        format!(
            " in {n} second{} of the run: {which}",
            if n == 1 { "" } else { "s" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_counted_per_second_and_the_busiest_seconds_named() {
        let mut log = WaitLog::default();
        assert_eq!(log.summary(), "");
        log.note(0, 0);
        log.note(3, 5);
        log.note(3, 9);
        log.note(4, 9);
        log.note(7, 10);
        assert_eq!(log.seconds_with_waits(), 2);
        assert_eq!(
            log.summary(),
            " in 2 seconds of the run: at 3 s (9), at 7 s (1)"
        );
        // Second s has s waits: the 8 busiest are named, in time order.
        let mut total = 10;
        for s in 10..20 {
            total += s;
            log.note(s, total);
        }
        assert_eq!(log.seconds_with_waits(), 12);
        assert_eq!(
            log.summary(),
            " in 12 seconds of the run: the most at 12 s (12), at 13 s (13), at 14 s (14), \
             at 15 s (15), at 16 s (16), at 17 s (17), at 18 s (18), at 19 s (19)"
        );
    }

    #[test]
    fn seconds_past_the_kept_ones_are_still_counted() {
        let mut log = WaitLog::default();
        for s in 0..(MAX_SECONDS as u64 + 10) {
            log.note(s, s + 1);
        }
        assert_eq!(log.seconds_with_waits(), MAX_SECONDS as u64 + 10);
    }
}
