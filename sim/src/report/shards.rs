//! The summary of many sharded runs: per kind of fault, the runs, the largest measurements
//! against their bounds and the violations; the cases measured, the moves, the violations by
//! property; then runs and violations per (kind, number of shards), where a cell no run reached
//! reads `EMPTY`.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::Duration;

use crate::checker::{Property, ShardMeasurements};
use crate::run::RunOutcome;
use crate::setup::{Params, RunKind, RunOptions, Sharding};

#[derive(Debug, Default, Clone, Copy)]
struct Row {
    runs: u64,
    faults: usize,
    measured: ShardMeasurements,
    violations: u64,
}

/// The aggregate of many sharded runs.
#[derive(Debug, Clone)]
pub struct ShardReport {
    params: Params,
    replicas: usize,
    rows: BTreeMap<RunKind, Row>,
    /// Runs and violations per kind and number of shards.
    cells: BTreeMap<(RunKind, u32), (u64, u64)>,
    /// Violations by property.
    properties: BTreeMap<Property, u64>,
    seeds: u64,
    violations: u64,
}

impl ShardReport {
    /// An empty report for runs with `params` and `replicas` replicas.
    pub fn new(params: Params, replicas: usize) -> Self {
        Self {
            params,
            replicas,
            rows: BTreeMap::new(),
            cells: BTreeMap::new(),
            properties: BTreeMap::new(),
            seeds: 0,
            violations: 0,
        }
    }

    /// Adds one run.
    pub fn add(&mut self, outcome: &RunOutcome) {
        for violation in &outcome.violations {
            *self.properties.entry(violation.property).or_default() += 1;
        }
        self.add_row(
            &outcome.options,
            outcome.measurements.faults,
            &outcome.measurements.shards,
            outcome.violations.len(),
        );
    }

    /// Adds a run of `options` that panicked: one violation, nothing measured.
    pub fn add_panic(&mut self, options: &RunOptions) {
        *self.properties.entry(Property::Harness).or_default() += 1;
        self.add_row(options, 0, &ShardMeasurements::default(), 1);
    }

    fn add_row(
        &mut self,
        options: &RunOptions,
        faults: usize,
        measured: &ShardMeasurements,
        violations: usize,
    ) {
        let kind = options.kind;
        let shards = options.sharding.map_or(0, |s| s.shards);
        let cell = self.cells.entry((kind, shards)).or_default();
        cell.0 += 1;
        cell.1 += violations as u64;
        let row = self.rows.entry(kind).or_default();
        row.runs += 1;
        row.faults += faults;
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

    /// The (kind × K) cells of the default shard counts that no run reached, in table order.
    pub fn empty_cells(&self) -> Vec<String> {
        let mut empty = Vec::new();
        for kind in RunKind::sharded_all() {
            for shards in Sharding::SHARD_COUNTS {
                if !self.cells.contains_key(&(kind, shards)) {
                    empty.push(format!("{kind} × K={shards}"));
                }
            }
        }
        empty
    }

    /// The largest values over every run.
    pub fn maxima(&self) -> ShardMeasurements {
        let mut all = ShardMeasurements::default();
        for row in self.rows.values() {
            all.merge(&row.measured);
        }
        all
    }
}

fn cell(value: Option<Duration>) -> String {
    value.map_or_else(|| "-".to_owned(), |d| d.as_millis().to_string())
}

const HEADER: [&str; 11] = [
    "fault kind",
    "runs",
    "faults",
    "overlap",
    "detection",
    "orphan idle",
    "gap",
    "ghost gap",
    "leaderless",
    "balance",
    "violations",
];

fn line(out: &mut String, fields: [&str; 11]) {
    let _ = writeln!(
        out,
        "{:<17} {:>6} {:>7} {:>8} {:>10} {:>12} {:>9} {:>10} {:>11} {:>8} {:>10}",
        fields[0],
        fields[1],
        fields[2],
        fields[3],
        fields[4],
        fields[5],
        fields[6],
        fields[7],
        fields[8],
        fields[9],
        fields[10]
    );
}

fn write_row(out: &mut String, name: &str, row: &Row) {
    let m = &row.measured;
    line(
        out,
        [
            name,
            &row.runs.to_string(),
            &row.faults.to_string(),
            &cell(m.overlap),
            &cell(m.detection),
            &cell(m.orphan_idle),
            &cell(m.gap),
            &cell(m.ghost_gap),
            &cell(m.leaderless),
            &cell(m.balance),
            &row.violations.to_string(),
        ],
    );
}

impl fmt::Display for ShardReport {
    /// The tables, then the summary line `seeds: N, violations: V`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.params;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "sharded: {} replicas; I = {} ms, T = {} ms, tick = {} ms, latency <= {} ms; maxima per shard in ms (bound)",
            self.replicas,
            p.interval.as_millis(),
            p.longest_work.as_millis(),
            p.tick.as_millis(),
            p.max_latency.as_millis()
        );
        line(&mut out, HEADER);
        let bound = |d: Duration| format!("({})", d.as_millis());
        let balance = Sharding::SHARD_COUNTS
            .iter()
            .map(|&shards| {
                let sharding = Sharding { shards };
                p.balance_bound(shards, self.replicas, sharding.moves(*p))
            })
            .max()
            .unwrap_or_default();
        line(
            &mut out,
            [
                "(bound)",
                "",
                "",
                &bound(p.overlap_bound()),
                &bound(p.detection_bound()),
                &bound(p.orphan_bound()),
                &format!(
                    "({}/{})",
                    p.gap_bound().as_millis(),
                    (p.gap_bound() + p.interval).as_millis()
                ),
                "(-)",
                "(-)",
                &bound(balance),
                "",
            ],
        );
        let mut all = Row::default();
        for (kind, row) in &self.rows {
            write_row(&mut out, kind.name(), row);
            all.runs += row.runs;
            all.faults += row.faults;
            all.measured.merge(&row.measured);
            all.violations += row.violations;
        }
        write_row(&mut out, "all", &all);
        let m = all.measured;
        let _ = writeln!(
            out,
            "cases measured: {} shard terms, {} overlaps, {} detections, {} idle periods of members, {} free shards re-owned ({} with a ghost, a leave or a join in the window), {} handovers and {} stops checked against their work",
            m.terms,
            m.overlaps,
            m.detections,
            m.idle_periods,
            m.gaps + m.ghost_gaps,
            m.ghost_gaps,
            m.handovers,
            m.stops
        );
        let per_change = if m.membership_changes == 0 {
            "-".to_owned()
        } else {
            format!("{:.2}", m.moves as f64 / m.membership_changes as f64)
        };
        let _ = writeln!(
            out,
            "moves: {} shard moves over {} membership changes ({per_change} per change); after every replica was up: {} in all, at most {} in one run",
            m.moves, m.membership_changes, m.settle_moves, m.max_settle_moves
        );
        if !self.properties.is_empty() {
            let list: Vec<String> = self
                .properties
                .iter()
                .map(|(property, count)| format!("{property} {count}"))
                .collect();
            let _ = writeln!(out, "violations by property: {}", list.join(", "));
        }
        self.write_cells(&mut out);
        write!(
            out,
            "seeds: {}, violations: {}",
            self.seeds, self.violations
        )?;
        f.write_str(&out)
    }
}

impl ShardReport {
    /// The cell table: per sharded run kind and number of shards, `runs/violations`; `EMPTY`
    /// where no run reached the cell; then how many cells ran.
    fn write_cells(&self, out: &mut String) {
        let mut counts: Vec<u32> = Sharding::SHARD_COUNTS.to_vec();
        for &(_, shards) in self.cells.keys() {
            if !counts.contains(&shards) {
                counts.push(shards);
            }
        }
        let _ = write!(
            out,
            "runs/violations per kind and number of shards (EMPTY: never run)\n{:<17}",
            "fault kind"
        );
        for shards in &counts {
            let _ = write!(out, " {:>9}", format!("K={shards}"));
        }
        let _ = writeln!(out);
        let mut all = vec![(0, 0); counts.len()];
        for kind in RunKind::sharded_all() {
            let _ = write!(out, "{:<17}", kind.name());
            for (index, shards) in counts.iter().enumerate() {
                let text = match self.cells.get(&(kind, *shards)) {
                    Some(&(runs, violations)) => {
                        all[index].0 += runs;
                        all[index].1 += violations;
                        format!("{runs}/{violations}")
                    }
                    None => "EMPTY".to_owned(),
                };
                let _ = write!(out, " {text:>9}");
            }
            let _ = writeln!(out);
        }
        let _ = write!(out, "{:<17}", "all");
        for (runs, violations) in all {
            let _ = write!(out, " {:>9}", format!("{runs}/{violations}"));
        }
        let _ = writeln!(out);
        let empty = self.empty_cells();
        let cells = RunKind::SHARDED_COUNT * Sharding::SHARD_COUNTS.len();
        let _ = writeln!(out, "cells run: {} of {cells}", cells - empty.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(options: RunOptions) -> RunOutcome {
        RunOutcome {
            options,
            measurements: crate::checker::Measurements::default(),
            violations: Vec::new(),
            trace: Vec::new(),
        }
    }

    #[test]
    fn one_cycle_of_sharded_seeds_fills_every_cell_and_the_report_ends_with_the_summary() {
        let mut report = ShardReport::new(Params::default(), 3);
        for seed in 500..500 + Sharding::CYCLE {
            report.add(&clean(RunOptions::sharded(seed)));
        }
        report.add_panic(&RunOptions::sharded(7));
        assert_eq!(report.empty_cells(), Vec::<String>::new());
        let text = report.to_string();
        assert!(text.contains("\ncells run: 39 of 39\n"), "{text}");
        assert!(text.contains("violations by property: harness 1"), "{text}");
        assert_eq!(text.lines().last(), Some("seeds: 40, violations: 1"));
    }
}
