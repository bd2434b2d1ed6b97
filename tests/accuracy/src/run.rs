//! Runs the analysis on every scenario and judges it; renders the table.

use analysis_core::{Config, analyze};

use crate::scenario::{Scenario, Truth};
use crate::score::{Baseline, Judgement, Totals, judge, totals};

/// One scenario's outcome.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub name: String,
    pub kind: &'static str,
    pub truth: Truth,
    pub judgement: Judgement,
}

/// Analyses `s` with the default configuration and judges the report.
pub fn evaluate(s: &Scenario) -> Result<Outcome, crate::scenario::LoadError> {
    let trace = s.history.load()?;
    let report = analyze(&trace, &Config::default());
    let value = serde_json::to_value(&report).unwrap_or_default();
    Ok(Outcome {
        name: s.name.clone(),
        kind: s.history.kind(),
        truth: s.truth.clone(),
        judgement: judge(&s.truth, &value),
    })
}

pub fn summary(outcomes: &[Outcome]) -> Totals {
    totals(outcomes.iter().map(|o| (&o.truth, &o.judgement)))
}

pub fn baseline(outcomes: &[Outcome]) -> Baseline {
    Baseline {
        scenarios: outcomes
            .iter()
            .map(|o| (o.name.clone(), (&o.judgement).into()))
            .collect(),
        totals: summary(outcomes),
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The markdown table: one row per scenario, then the totals.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::from(
        "| Scenario | History | Truth | Our first problem | Verdict |\n|---|---|---|---|---|\n",
    );
    for o in outcomes {
        let first = o
            .judgement
            .first
            .as_ref()
            .map_or("none".to_string(), |p| p.label());
        let verdict = if o.judgement.pass {
            "pass".to_string()
        } else {
            format!("FAIL: {}", o.judgement.reason)
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} ({} problems) | {} |\n",
            o.name,
            o.kind,
            cell(&o.truth.label()),
            cell(&first),
            o.judgement.problems,
            cell(&verdict)
        ));
    }
    let t = summary(outcomes);
    out.push_str(&format!(
        "\n**{} scenarios ({} healthy, {} faulty): {} pass.** Precision {:.3} (TP {}, FP {}), recall {:.3} (FN {}), first finding right {:.3}, healthy with no alarm {:.3}.\n",
        t.scenarios, t.healthy, t.faulty, t.passed, t.precision, t.tp, t.fp, t.recall, t.fn_, t.first_right, t.healthy_quiet
    ));
    out
}
