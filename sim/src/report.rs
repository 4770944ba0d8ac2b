//! The summary of many runs: per kind of fault, the runs, the largest measurements against
//! their bounds, and the violations; then the cases measured and what fencing runs came to.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::Duration;

use crate::checker::Measurements;
use crate::nemesis::RunKind;
use crate::params::Params;
use crate::run::RunOutcome;

#[derive(Debug, Default, Clone, Copy)]
struct Row {
    runs: u64,
    measured: Measurements,
    violations: u64,
}

/// The aggregate of many runs.
#[derive(Debug, Clone)]
pub struct Report {
    params: Params,
    rows: BTreeMap<RunKind, Row>,
    seeds: u64,
    violations: u64,
}

impl Report {
    /// An empty report for runs with `params`.
    pub fn new(params: Params) -> Self {
        Self {
            params,
            rows: BTreeMap::new(),
            seeds: 0,
            violations: 0,
        }
    }

    /// Adds one run.
    pub fn add(&mut self, outcome: &RunOutcome) {
        self.add_row(
            outcome.options.kind,
            &outcome.measurements,
            outcome.violations.len(),
        );
    }

    /// Adds a run that panicked: one violation, nothing measured.
    pub fn add_panic(&mut self, kind: RunKind) {
        self.add_row(kind, &Measurements::default(), 1);
    }

    fn add_row(&mut self, kind: RunKind, measured: &Measurements, violations: usize) {
        let row = self.rows.entry(kind).or_default();
        row.runs += 1;
        row.measured.merge(measured);
        row.violations += violations as u64;
        self.seeds += 1;
        self.violations += violations as u64;
    }

    /// The number of runs.
    pub fn seeds(&self) -> u64 {
        self.seeds
    }

    /// The number of violations over every run.
    pub fn violations(&self) -> u64 {
        self.violations
    }

    /// The largest values over every run.
    pub fn maxima(&self) -> Measurements {
        let mut all = Measurements::default();
        for row in self.rows.values() {
            all.merge(&row.measured);
        }
        all
    }
}

fn cell(value: Option<Duration>) -> String {
    value.map_or_else(|| "-".to_owned(), |d| d.as_millis().to_string())
}

impl fmt::Display for Report {
    /// The table, then the summary line `seeds: N, violations: V`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.params;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "I = {} ms, T = {} ms, tick = {} ms, latency <= {} ms; maxima in ms (bound)",
            p.interval.as_millis(),
            p.longest_work.as_millis(),
            p.tick.as_millis(),
            p.max_latency.as_millis()
        );
        let _ = writeln!(
            out,
            "{:<17} {:>6} {:>7} {:>14} {:>10} {:>14} {:>13} {:>11} {:>10}",
            "fault kind",
            "runs",
            "faults",
            "overlap",
            "gap",
            "detection",
            "orphan idle",
            "fence wait",
            "violations"
        );
        let _ = writeln!(
            out,
            "{:<17} {:>6} {:>7} {:>14} {:>10} {:>14} {:>13} {:>11} {:>10}",
            "(bound)",
            "",
            "",
            format!("({})", p.overlap_bound().as_millis()),
            format!("({})", p.gap_bound().as_millis()),
            format!("({})", p.detection_bound().as_millis()),
            format!("({})", p.orphan_bound().as_millis()),
            "(-)",
            ""
        );
        let mut all = Row::default();
        for (kind, row) in &self.rows {
            write_row(&mut out, kind.name(), row);
            all.runs += row.runs;
            all.measured.merge(&row.measured);
            all.violations += row.violations;
        }
        write_row(&mut out, "all", &all);
        let cases = all.measured.cases;
        let _ = writeln!(
            out,
            "cases measured: {} overlaps, {} leaderless gaps with a healthy standby, {} detections, {} idle periods of lock holders, {} grants at a lock_timeout (55P03)",
            cases.overlaps, cases.gaps, cases.detections, cases.idle_periods, cases.timeout_grants
        );
        let fence = all.measured.fence;
        let _ = writeln!(
            out,
            "fencing runs: {}, terms with epochs: {} ({} began after their session was lost), fenced writes: {} accepted, {} stale, {} failed; fenced commits checked: {} (on a deposed primary: {})",
            fence.runs,
            fence.epochs,
            fence.late_terms,
            fence.accepted,
            fence.stale,
            fence.failed,
            fence.commits,
            fence.deposed_commits
        );
        write!(
            out,
            "seeds: {}, violations: {}",
            self.seeds, self.violations
        )?;
        f.write_str(&out)
    }
}

fn write_row(out: &mut String, name: &str, row: &Row) {
    let m = &row.measured;
    let _ = writeln!(
        out,
        "{:<17} {:>6} {:>7} {:>14} {:>10} {:>14} {:>13} {:>11} {:>10}",
        name,
        row.runs,
        m.faults,
        cell(m.overlap),
        cell(m.gap),
        cell(m.detection),
        cell(m.orphan_idle),
        cell(m.advance_wait),
        row.violations
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::RunOptions;

    #[test]
    fn the_report_ends_with_the_summary_line() {
        let mut report = Report::new(Params::default());
        report.add(&RunOutcome {
            options: RunOptions::new(13),
            measurements: Measurements::default(),
            violations: Vec::new(),
            trace: Vec::new(),
        });
        report.add_panic(RunKind::for_seed(3));
        let text = report.to_string();
        assert_eq!(text.lines().last(), Some("seeds: 2, violations: 1"));
        assert!(text.contains("\nmixed "), "{text}");
        assert!(text.contains("\ncrash "), "{text}");
    }
}
