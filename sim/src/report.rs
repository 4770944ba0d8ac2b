//! The summary of many runs: per kind of fault, the runs, the largest measurements against
//! their bounds, and the violations; the cases measured and what fencing runs came to; then
//! the cell table, runs and violations per (kind, acquire mode, fencing), where a cell no run
//! reached reads `EMPTY`.

mod shards;

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::Duration;

use plexsphere_leader::config::AcquireMode;

use crate::checker::Measurements;
use crate::run::RunOutcome;
use crate::setup::{Params, RunKind, RunOptions};

pub use shards::ShardReport;

#[derive(Debug, Default, Clone, Copy)]
struct Row {
    runs: u64,
    measured: Measurements,
    violations: u64,
}

/// The runs and violations of one cell of the cell table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count {
    runs: u64,
    violations: u64,
}

/// The cell table's columns: acquire mode, then fencing off and on.
const COLUMNS: [&str; 4] = ["poll", "poll+fencing", "queue", "queue+fencing"];

/// The column of a run: its acquire mode, then whether it fences.
fn column(options: &RunOptions) -> usize {
    let queue = usize::from(options.mode == AcquireMode::Queue);
    2 * queue + usize::from(options.fencing)
}

/// The aggregate of many runs.
#[derive(Debug, Clone)]
pub struct Report {
    params: Params,
    rows: BTreeMap<RunKind, Row>,
    /// Runs and violations per kind and [`column`].
    cells: BTreeMap<RunKind, [Count; 4]>,
    seeds: u64,
    violations: u64,
}

impl Report {
    /// An empty report for runs with `params`.
    pub fn new(params: Params) -> Self {
        Self {
            params,
            rows: BTreeMap::new(),
            cells: BTreeMap::new(),
            seeds: 0,
            violations: 0,
        }
    }

    /// Adds one run.
    pub fn add(&mut self, outcome: &RunOutcome) {
        self.add_row(
            &outcome.options,
            &outcome.measurements,
            outcome.violations.len(),
        );
    }

    /// Adds a run of `options` that panicked: one violation, nothing measured.
    pub fn add_panic(&mut self, options: &RunOptions) {
        self.add_row(options, &Measurements::default(), 1);
    }

    fn add_row(&mut self, options: &RunOptions, measured: &Measurements, violations: usize) {
        let kind = options.kind;
        let cell = &mut self.cells.entry(kind).or_default()[column(options)];
        cell.runs += 1;
        cell.violations += violations as u64;
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

    /// The cells of the cell table that no run reached, as `kind × column`
    /// (`partition × queue+fencing`), in table order.
    pub fn empty_cells(&self) -> Vec<String> {
        let mut empty = Vec::new();
        for kind in RunKind::all() {
            let counts = self.cells.get(&kind).copied().unwrap_or_default();
            for (count, name) in counts.iter().zip(COLUMNS) {
                if count.runs == 0 {
                    empty.push(format!("{kind} × {name}"));
                }
            }
        }
        empty
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
        self.write_cells(&mut out);
        write!(
            out,
            "seeds: {}, violations: {}",
            self.seeds, self.violations
        )?;
        f.write_str(&out)
    }
}

impl Report {
    /// The cell table: per run kind (every one, run or not) and column, `runs/violations`;
    /// `EMPTY` where no run reached the cell; then how many cells ran and which did not.
    fn write_cells(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "runs/violations per kind and acquire mode, fencing off and on (EMPTY: never run)"
        );
        let _ = writeln!(
            out,
            "{:<17} {:>9} {:>14} {:>9} {:>15}",
            "fault kind", COLUMNS[0], COLUMNS[1], COLUMNS[2], COLUMNS[3]
        );
        let mut all = [Count::default(); 4];
        for kind in RunKind::all() {
            let counts = self.cells.get(&kind).copied().unwrap_or_default();
            for (sum, count) in all.iter_mut().zip(counts) {
                sum.runs += count.runs;
                sum.violations += count.violations;
            }
            write_cells_row(out, kind.name(), &counts);
        }
        write_cells_row(out, "all", &all);
        let empty = self.empty_cells();
        let cells = RunKind::COUNT * COLUMNS.len();
        let _ = write!(out, "cells run: {} of {cells}", cells - empty.len());
        match empty.as_slice() {
            [] => {}
            [first, rest @ ..] if rest.len() < 4 => {
                let _ = write!(out, "; EMPTY: {first}");
                for name in rest {
                    let _ = write!(out, ", {name}");
                }
            }
            [first, ..] => {
                let _ = write!(out, "; EMPTY: {first} and {} more", empty.len() - 1);
            }
        }
        let _ = writeln!(out);
    }
}

fn write_cells_row(out: &mut String, name: &str, counts: &[Count; 4]) {
    let text = |count: &Count| {
        if count.runs == 0 {
            "EMPTY".to_owned()
        } else {
            format!("{}/{}", count.runs, count.violations)
        }
    };
    let _ = writeln!(
        out,
        "{:<17} {:>9} {:>14} {:>9} {:>15}",
        name,
        text(&counts[0]),
        text(&counts[1]),
        text(&counts[2]),
        text(&counts[3])
    );
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

    fn clean(options: RunOptions) -> RunOutcome {
        RunOutcome {
            options,
            measurements: Measurements::default(),
            violations: Vec::new(),
            trace: Vec::new(),
        }
    }

    /// The row of the cell table that begins with `name` (the last such line of the report).
    fn cells_row<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        let line = text
            .lines()
            .rfind(|line| line.split_whitespace().next() == Some(name))
            .unwrap_or_default();
        line.split_whitespace().skip(1).collect()
    }

    #[test]
    fn the_report_ends_with_the_summary_line() {
        let mut report = Report::new(Params::default());
        report.add(&clean(RunOptions::new(13)));
        report.add_panic(&RunOptions::new(3));
        let text = report.to_string();
        assert_eq!(text.lines().last(), Some("seeds: 2, violations: 1"));
        assert!(text.contains("\nmixed "), "{text}");
        assert!(text.contains("\ncrash "), "{text}");
    }

    /// A cell no run reached reads EMPTY in its row, every kind has a row whether it ran or
    /// not, and the count of cells run names the empty ones.
    #[test]
    fn an_empty_cell_reads_empty_and_is_named_under_the_table() {
        let mut report = Report::new(Params::default());
        // Seed 0 polls (partition), 14 queues, 28 polls and fences; queue+fencing (42) missing.
        for seed in [0, 14, 28] {
            report.add(&clean(RunOptions::new(seed)));
        }
        report.add_panic(&RunOptions::new(56));
        let text = report.to_string();
        assert_eq!(
            cells_row(&text, "partition"),
            ["2/1", "1/0", "1/0", "EMPTY"]
        );
        assert_eq!(
            cells_row(&text, "resign"),
            ["EMPTY", "EMPTY", "EMPTY", "EMPTY"]
        );
        assert_eq!(cells_row(&text, "all"), ["2/1", "1/0", "1/0", "EMPTY"]);
        assert!(
            text.contains("\ncells run: 3 of 56; EMPTY: partition × queue+fencing and 52 more\n"),
            "{text}"
        );
        assert_eq!(report.empty_cells().len(), 53);
        assert_eq!(report.empty_cells()[0], "partition × queue+fencing");
    }

    /// One cycle of seeds fills every cell exactly once.
    #[test]
    fn one_cycle_of_seeds_fills_every_cell() {
        let mut report = Report::new(Params::default());
        for seed in 1000..1000 + RunOptions::CYCLE {
            report.add(&clean(RunOptions::new(seed)));
        }
        let text = report.to_string();
        assert_eq!(report.empty_cells(), Vec::<String>::new());
        assert!(text.contains("\ncells run: 56 of 56\n"), "{text}");
        for kind in RunKind::all() {
            assert_eq!(cells_row(&text, kind.name()), ["1/0"; 4], "{text}");
        }
    }

    #[test]
    fn a_few_empty_cells_are_all_named() {
        let mut report = Report::new(Params::default());
        for seed in 0..RunOptions::CYCLE - 2 {
            report.add(&clean(RunOptions::new(seed)));
        }
        assert!(
            report.to_string().contains(
                "\ncells run: 54 of 56; EMPTY: resign × queue+fencing, mixed × queue+fencing\n"
            ),
            "{report}"
        );
    }
}
