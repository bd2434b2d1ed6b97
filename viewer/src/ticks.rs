//! Axis ticks at round numbers of the unit an axis shows: one unit per axis (500 MiB,
//! 1000 MiB, 1500 MiB, not 954 MiB and 1.86 GiB) and one number of decimals for every label
//! of an axis (0.5 s, 1.0 s, 1.5 s).

/// One tick: where it is, in the axis's raw unit (bytes, nanoseconds), and its label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tick {
    pub value: u64,
    pub label: String,
}

/// The round step (1, 2, 2.5 or 5 times a power of ten) nearest above `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let pow = 10f64.powf(raw.log10().floor());
    let frac = raw / pow;
    let m = if frac <= 1.0 {
        1.0
    } else if frac <= 2.0 {
        2.0
    } else if frac <= 2.5 {
        2.5
    } else if frac <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * pow
}

/// Decimals needed to write every multiple of `step` exactly.
fn decimals(step: f64) -> usize {
    let mut d = 0;
    let mut s = step;
    while d < 6 && (s - s.round()).abs() > 1e-6 * s.abs().max(1.0) {
        s *= 10.0;
        d += 1;
    }
    d
}

/// Ticks over `[lo, hi]` (raw units), about `target` of them, at multiples of a round step in
/// one of `units` (name, size in raw units; smallest first, the first counted in whole
/// numbers): the largest unit that `hi` reaches twice, or a smaller one where that unit would
/// need more than three decimals.
fn ticks_in(lo: u64, hi: u64, units: &[(&str, f64)], target: usize) -> Vec<Tick> {
    let mut u = 0;
    while u + 1 < units.len() && hi as f64 >= 2.0 * units[u + 1].1 {
        u += 1;
    }
    loop {
        let (name, size) = units[u];
        let (a, b) = (lo as f64 / size, hi as f64 / size);
        let mut step = nice_step((b - a) / target.max(1) as f64);
        if u == 0 {
            step = step.max(1.0);
        }
        let d = decimals(step);
        if d > 3 && u > 0 {
            u -= 1;
            continue;
        }
        let first = (a / step - 1e-9).ceil() as i64;
        let last = (b / step + 1e-9).floor() as i64;
        return (first..=last)
            .map(|k| {
                let v = k as f64 * step;
                Tick {
                    value: (v * size).round() as u64,
                    label: format!("{v:.d$} {name}"),
                }
            })
            .collect();
    }
}

/// Byte ticks over `[0, max_bytes]`, about `target` of them, in the largest binary unit the
/// axis reaches at least twice (so a 1.5 GiB axis counts in MiB: 0, 500, 1000, 1500 MiB).
pub fn byte_ticks(max_bytes: u64, target: usize) -> Vec<Tick> {
    const UNITS: [(&str, f64); 6] = [
        ("B", 1.0),
        ("KiB", 1024.0),
        ("MiB", 1_048_576.0),
        ("GiB", 1_073_741_824.0),
        ("TiB", 1_099_511_627_776.0),
        ("PiB", 1_125_899_906_842_624.0),
    ];
    ticks_in(0, max_bytes, &UNITS, target)
}

/// Time ticks over `[lo, hi]` nanoseconds (times since the trace start), about `target` of
/// them, in one unit (ns, µs, ms, s, min, h) chosen as for bytes.
pub fn time_ticks(lo: u64, hi: u64, target: usize) -> Vec<Tick> {
    const UNITS: [(&str, f64); 6] = [
        ("ns", 1.0),
        ("µs", 1e3),
        ("ms", 1e6),
        ("s", 1e9),
        ("min", 60e9),
        ("h", 3600e9),
    ];
    ticks_in(lo, hi, &UNITS, target)
}

/// Two times (nanoseconds) written in one unit, the largest that `t1` reaches once (ns, µs,
/// ms, s; min past 2 min, h past 2 h), with two decimals (none for ns): a window reads
/// "0.00 s – 3.08 s", not "0 ns – 3.08 s".
pub fn time_pair(t0: u64, t1: u64) -> (String, String) {
    let f = time_format(t0.max(t1));
    (f(t0), f(t1))
}

/// Times (nanoseconds) written as a column of a table: all in the unit `time_pair` picks for
/// the largest, with the same decimals ("0.85 s", "1.20 s", not "850.00 ms", "1.20 s").
pub fn time_column(times: &[u64]) -> Vec<String> {
    let f = time_format(times.iter().copied().max().unwrap_or(0));
    times.iter().map(|&t| f(t)).collect()
}

/// A time (nanoseconds) written as `time_pair` writes it beside `hi`: in the unit of a window
/// or a trace that ends at `hi`, so a moment reads like the window's ends ("0.42 s" in
/// "0.00 s – 3.08 s", not "420.00 ms").
pub fn time_in_unit_of(t: u64, hi: u64) -> String {
    time_format(hi.max(t))(t)
}

/// How `time_pair` and `time_column` write a time when the largest is `hi` nanoseconds.
fn time_format(hi: u64) -> impl Fn(u64) -> String {
    const UNITS: [(&str, f64, f64); 6] = [
        ("ns", 1.0, 1.0),
        ("µs", 1e3, 1e3),
        ("ms", 1e6, 1e6),
        ("s", 1e9, 1e9),
        ("min", 60e9, 120e9),
        ("h", 3600e9, 7200e9),
    ];
    let hi = hi as f64;
    let (name, size, _) = UNITS
        .iter()
        .rev()
        .find(|(_, _, from)| hi >= *from)
        .copied()
        .unwrap_or(UNITS[0]);
    let d = usize::from(name != "ns") * 2;
    move |t: u64| format!("{:.d$} {name}", t as f64 / size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(t: &[Tick]) -> Vec<&str> {
        t.iter().map(|t| t.label.as_str()).collect()
    }

    #[test]
    fn byte_ticks_are_round_in_one_unit() {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        // 1.05e9 bytes (about 1001 MiB): MiB, at round hundreds, never 954 MiB.
        let t = byte_ticks(1_050_000_000, 6);
        assert_eq!(
            labels(&t),
            [
                "0 MiB", "200 MiB", "400 MiB", "600 MiB", "800 MiB", "1000 MiB"
            ]
        );
        assert_eq!(t[1].value, 200 * MIB);
        // 10 GiB: whole GiB.
        let t = byte_ticks(10 * GIB, 5);
        assert_eq!(
            labels(&t),
            ["0 GiB", "2 GiB", "4 GiB", "6 GiB", "8 GiB", "10 GiB"]
        );
        // 2.3 GiB: one decimal on every label.
        let t = byte_ticks(2 * GIB + 300 * MIB, 5);
        assert_eq!(
            labels(&t),
            ["0.0 GiB", "0.5 GiB", "1.0 GiB", "1.5 GiB", "2.0 GiB"]
        );
        assert_eq!(t[1].value, GIB / 2);
        // Small axes count whole bytes.
        assert_eq!(labels(&byte_ticks(3, 6)), ["0 B", "1 B", "2 B", "3 B"]);
        assert_eq!(byte_ticks(0, 6).len(), 1);
        assert!(byte_ticks(u64::MAX, 6).len() <= 7);
    }

    #[test]
    fn time_ticks_share_one_unit_and_precision() {
        let t = time_ticks(0, 3_200_000_000, 8);
        assert_eq!(
            labels(&t),
            [
                "0.0 s", "0.5 s", "1.0 s", "1.5 s", "2.0 s", "2.5 s", "3.0 s"
            ]
        );
        // A zoomed window: ticks start at the first round time inside it.
        let t = time_ticks(1_234_100_000, 1_236_000_000, 4);
        assert_eq!(
            labels(&t),
            ["1234.5 ms", "1235.0 ms", "1235.5 ms", "1236.0 ms"]
        );
        assert_eq!(t[0].value, 1_234_500_000);
        let t = time_ticks(0, 7_200_000_000_000, 6);
        assert_eq!(labels(&t), ["0.0 h", "0.5 h", "1.0 h", "1.5 h", "2.0 h"]);
        // Deep zoom: a smaller unit rather than six decimals of seconds.
        let t = time_ticks(1_234_100_000, 1_234_105_000, 5);
        assert_eq!(labels(&t)[0], "1234.100 ms");
        assert_eq!(
            labels(&time_ticks(0, 5, 6)),
            ["0 ns", "1 ns", "2 ns", "3 ns", "4 ns", "5 ns"]
        );
    }

    #[test]
    fn a_pair_of_times_shares_one_unit() {
        let p = |a, b| {
            let (x, y) = time_pair(a, b);
            format!("{x} – {y}")
        };
        assert_eq!(p(0, 3_080_000_000), "0.00 s – 3.08 s");
        assert_eq!(p(1_500, 321_560_000), "0.00 ms – 321.56 ms");
        assert_eq!(p(0, 999), "0 ns – 999 ns");
        assert_eq!(p(60_000_000_000, 150_000_000_000), "1.00 min – 2.50 min");
        assert_eq!(p(0, 0), "0 ns – 0 ns");
    }

    #[test]
    fn a_column_of_times_shares_the_unit_of_its_largest() {
        assert_eq!(
            time_column(&[850_000_000, 1_200_000_000, 40_000]),
            ["0.85 s", "1.20 s", "0.00 s"]
        );
        assert_eq!(time_column(&[1_500, 321_560_000])[0], "0.00 ms");
        assert_eq!(time_column(&[12, 999]), ["12 ns", "999 ns"]);
        assert!(time_column(&[]).is_empty());
        assert_eq!(time_in_unit_of(420_000_000, 3_080_000_000), "0.42 s");
        assert_eq!(time_in_unit_of(300, 308_000_000), "0.00 ms");
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(170.0), 200.0);
        assert_eq!(nice_step(2.1), 2.5);
        assert_eq!(nice_step(6.0), 10.0);
        assert_eq!(decimals(0.25), 2);
        assert_eq!(decimals(200.0), 0);
    }
}
