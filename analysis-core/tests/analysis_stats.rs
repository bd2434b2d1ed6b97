//! The statistics the detectors rely on, checked against values computed independently with
//! Python 3 (numpy 2.4.6, scipy 1.17.1), to 1e-6. Each literal says how it was computed.

use analysis_core::Config;
use analysis_core::analysis::hidden::gap_rules;
use analysis_core::stats::*;

fn close(a: f64, b: f64, tol: f64) {
    assert!(
        (a - b).abs() <= tol * (1.0 + b.abs()),
        "{a} != {b} (tolerance {tol})"
    );
}

#[test]
fn least_squares_r_and_p_match_scipy_linregress() {
    // scipy.stats.linregress(np.arange(10.0), [3.1,4.9,7.2,8.8,11.5,12.9,15.2,16.8,19.1,21.3])
    let y = [3.1, 4.9, 7.2, 8.8, 11.5, 12.9, 15.2, 16.8, 19.1, 21.3];
    let f = linear_fit(y.iter().enumerate().map(|(i, &v)| (i as f64, v))).expect("fit");
    close(f.slope, 2.0109090909090908, 1e-9);
    close(f.intercept, 3.030909090909091, 1e-9);
    close(f.r, 0.9993020382135738, 1e-9);
    assert!((f.p_value - 1.037387111117658e-12).abs() < 1e-6);
    close(f.p_value, 1.037387111117658e-12, 1e-6);

    // scipy.stats.linregress([0.5,1,2.5,3,4.5,5,6.5,7,8.5,9,10.5,11],
    //                        [10,7,12,9,6,14,11,8,13,9,15,10])
    let x = [0.5, 1.0, 2.5, 3.0, 4.5, 5.0, 6.5, 7.0, 8.5, 9.0, 10.5, 11.0];
    let y = [10., 7., 12., 9., 6., 14., 11., 8., 13., 9., 15., 10.];
    let f = linear_fit(x.iter().copied().zip(y.iter().copied())).expect("fit");
    close(f.slope, 0.28063943161634103, 1e-9);
    close(f.intercept, 8.719656601539373, 1e-9);
    close(f.r, 0.3618400734660153, 1e-9);
    close(f.p_value, 0.24777919172231946, 1e-6);

    // scipy.stats.linregress([0,1,2,3,4], [5,3,4,1,2]): a negative slope.
    let y = [5., 3., 4., 1., 2.];
    let f = linear_fit(y.iter().enumerate().map(|(i, &v)| (i as f64, v))).expect("fit");
    close(f.slope, -0.8, 1e-12);
    close(f.intercept, 4.6, 1e-12);
    close(f.r, -0.8, 1e-12);
    close(f.p_value, 0.10408803866182778, 1e-6);
    close(f.r_squared, 0.64, 1e-12);
}

#[test]
fn student_t_two_sided_p_values_match_scipy() {
    // 2 * scipy.stats.t.sf(abs(t), df)
    let cases = [
        (2.1, 5.0, 0.08975324988459879),
        (0.5, 30.0, 0.6207230048851272),
        (3.7, 1000.0, 0.00022735131627369098),
        (1.0, 1.0, 0.5000000000000001),
        (-2.5, 12.0, 0.02791539957132524),
        (6.0, 3.0, 0.009272714892284666),
    ];
    for (t, df, p) in cases {
        let got = student_t_two_sided_p(t, df);
        assert!(
            (got - p).abs() < 1e-6 * p.max(1e-3),
            "t={t} df={df}: {got} != {p}"
        );
    }
}

#[test]
fn regularized_incomplete_beta_matches_scipy_betainc() {
    // scipy.special.betainc(a, b, x)
    let cases = [
        (2.5, 0.5, 0.3, 0.018927124071945658),
        (10.0, 0.5, 0.9, 0.15164090963470994),
        (0.5, 0.5, 0.5, 0.5000000000000001),
        (50.0, 0.5, 0.99, 0.3173043978741973),
    ];
    for (a, b, x, want) in cases {
        close(regularized_incomplete_beta(a, b, x), want, 1e-9);
    }
}

#[test]
fn quantiles_match_numpy_linear_interpolation() {
    // np.quantile([7,1,9,3,3,12,40,5,6,2], [0.25, 0.5, 0.75, 0.9])
    let data = [7., 1., 9., 3., 3., 12., 40., 5., 6., 2.];
    for (q, want) in [
        (0.25, 3.0),
        (0.5, 5.5),
        (0.75, 8.5),
        (0.9, 14.79999999999999),
    ] {
        let mut v = data.to_vec();
        close(quantile_select(&mut v, q).expect("q"), want, 1e-12);
        let mut s = data.to_vec();
        s.sort_by(f64::total_cmp);
        close(quantile_sorted(&s, q).expect("q"), want, 1e-12);
    }
    // The spike threshold of a training step's allocation sizes (MiB), as the spike detector
    // computes it: np.quantile(v, .75) + 1.5 * (np.quantile(v, .75) - np.quantile(v, .25)).
    let mut v = vec![
        8., 8., 8., 16., 16., 16., 24., 24., 24., 32., 32., 32., 35., 16., 20., 24., 28., 32., 36.,
        2048.,
    ];
    let q1 = quantile_select(&mut v, 0.25).expect("q1");
    let q3 = quantile_select(&mut v, 0.75).expect("q3");
    close(q1, 16.0, 1e-12);
    close(q3, 32.0, 1e-12);
    close(q3 + 1.5 * (q3 - q1), 56.0, 1e-12);
}

#[test]
fn z_scores_and_hidden_spike_rule_match_scipy_zscore() {
    // scipy.stats.zscore([1.0,1.1,0.9,1.05,5.0,1.0,0.95,1.02]) (population std, ddof=0)
    let g = [1.0, 1.1, 0.9, 1.05, 5.0, 1.0, 0.95, 1.02];
    let want = [
        -0.3797817368665316,
        -0.3042032817687143,
        -0.45536019196434885,
        -0.341992509317623,
        2.6433564670461585,
        -0.3797817368665316,
        -0.4175709644154403,
        -0.36466604584696816,
    ];
    for (z, w) in z_scores(&g).iter().zip(want) {
        close(*z, w, 1e-9);
    }
    // As gaps in GiB on an 80 GiB device: sample 4 is the only transient spike (z > 2).
    const GIB: f64 = (1u64 << 30) as f64;
    let gaps: Vec<f64> = g.iter().map(|x| x * GIB).collect();
    let ts: Vec<u64> = (0..8).map(|i| i * 1_000_000_000).collect();
    let points = || ts.iter().copied().zip(gaps.iter().copied());
    let (spikes, drift, skipped) = gap_rules(&Config::default(), points, 80 << 30, 0);
    assert_eq!(skipped, None);
    assert_eq!(spikes.len(), 1);
    assert_eq!(spikes[0].ts_nanos, 4_000_000_000);
    close(spikes[0].z, 2.6433564670461585, 1e-9);
    assert!(drift.expect("8 samples give a drift fit").r_squared < 0.6);
    // Below 5 % of the device, the rules are skipped (reference).
    let (spikes, _, skipped) = gap_rules(&Config::default(), points, 1 << 40, 0);
    assert!(spikes.is_empty());
    assert!(skipped.is_some());
}

/// The rules' spikes, taken over passes through the gaps, are the gaps whose `z_scores` pass
/// the threshold, with those z-scores exactly: series flat, noisy, with outliers and negative.
#[test]
fn hidden_spikes_are_the_z_scores_over_the_threshold() {
    const GIB: f64 = (1u64 << 30) as f64;
    let mut x = 3u64;
    let mut next = move || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut found = 0;
    for series in 0..40 {
        let n = 3 + series * 7;
        let gaps: Vec<f64> = (0..n)
            .map(|i| match series % 4 {
                0 => 4.0 * GIB,
                1 => (4.0 + next()) * GIB,
                2 if i % 9 == 4 => 30.0 * GIB,
                2 => (4.0 + next() * 0.1) * GIB,
                _ => (next() - 0.5) * 40.0 * GIB,
            })
            .map(|g: f64| g.round())
            .collect();
        let ts: Vec<u64> = (0..n as u64).map(|i| 1_000 + i * 50_000_000).collect();
        let c = Config::default();
        let points = || ts.iter().copied().zip(gaps.iter().copied());
        let (spikes, _, skipped) = gap_rules(&c, points, 80 << 30, 0);
        assert_eq!(skipped, None, "series {series}");
        let want: Vec<(u64, i64, f64)> = z_scores(&gaps)
            .into_iter()
            .enumerate()
            .filter(|&(_, z)| z > c.hidden_spike_z)
            .map(|(i, z)| (ts[i], gaps[i] as i64, z))
            .collect();
        let got: Vec<(u64, i64, f64)> = spikes
            .iter()
            .map(|p| (p.ts_nanos, p.gap_bytes, p.z))
            .collect();
        assert_eq!(got, want, "series {series}");
        found += got.len();
    }
    assert!(found > 0, "some series have spikes");
}
