//! The summary of many runs: per kind of fault, the runs, the largest measurements against
//! their bounds, and the violations; the cases measured (and, for single-election runs, what
//! fencing runs came to; for sharded runs, the moves); the violations by property; then the
//! cell table, runs and violations per (kind, acquire mode and fencing) or per (kind, number of
//! shards), where a cell no run reached reads `EMPTY`. One report serves both mechanisms: the
//! tables of sharded runs are in [`shards`].

mod shards;

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::Duration;

use plexsphere_leader::config::AcquireMode;

use crate::checker::{Measurements, Property};
use crate::run::RunOutcome;
use crate::setup::{Params, RunKind, RunOptions, Sharding, Space};

#[derive(Debug, Default, Clone, Copy)]
struct Row {
    runs: u64,
    measured: Measurements,
    violations: u64,
}

impl Row {
    fn merge(&mut self, other: &Self) {
        self.runs += other.runs;
        self.measured.merge(&other.measured);
        self.violations += other.violations;
    }
}

/// The runs and violations of one cell of the cell table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count {
    runs: u64,
    violations: u64,
}

/// The cell table's columns of single-election runs: acquire mode, then fencing off and on.
const COLUMNS: [&str; 4] = ["poll", "poll+fencing", "queue", "queue+fencing"];

/// The cell table's columns of lease runs (which always poll): fenced writes off and on.
const LEASE_COLUMNS: [&str; 2] = ["lease", "lease+fencing"];

/// The column of a run: single-election runs, its acquire mode, then whether it fences
/// ([`COLUMNS`]); sharded runs, its number of shards.
fn column(options: &RunOptions) -> u32 {
    match options.sharding {
        Some(sharding) => sharding.shards,
        None => {
            let queue = u32::from(options.mode == AcquireMode::Queue);
            2 * queue + u32::from(options.fencing)
        }
    }
}

/// The aggregate of many runs, of the single election or of sharded leadership.
#[derive(Debug, Clone)]
pub struct Report {
    params: Params,
    /// How many replicas each run has (in the sharded tables' title).
    replicas: usize,
    /// The seed space of the runs: their kinds, and how they hold leadership.
    space: Space,
    /// Fitness runs (`--unfit`): the standbys probe before they try.
    probing: bool,
    rows: BTreeMap<RunKind, Row>,
    /// Runs and violations per kind and [`column`].
    cells: BTreeMap<(RunKind, u32), Count>,
    /// Violations by property.
    properties: BTreeMap<Property, u64>,
    seeds: u64,
    violations: u64,
}

impl Report {
    /// An empty report for the runs of `space` with `params` and `replicas` replicas each: the
    /// space's bounds and tables, a row and cells for each of its kinds.
    pub fn new(space: Space, params: Params, replicas: usize) -> Self {
        Self {
            params,
            replicas,
            space,
            probing: false,
            rows: BTreeMap::new(),
            cells: BTreeMap::new(),
            properties: BTreeMap::new(),
            seeds: 0,
            violations: 0,
        }
    }

    /// The same report for fitness runs (`--unfit`): its gap bound has the probe's round trip.
    pub fn probing(self) -> Self {
        Self {
            probing: true,
            ..self
        }
    }

    /// The cell table's columns, (the key [`column`] gives a run, name): acquire mode and
    /// fencing, fenced writes for a lease, or the number of shards (the seeds' three, then
    /// any a run forced).
    fn columns(&self) -> Vec<(u32, String)> {
        if !self.space.is_sharded() {
            let names: &[&str] = if self.space.mechanism().holds_session() {
                &COLUMNS
            } else {
                &LEASE_COLUMNS
            };
            return (0..).zip(names.iter().map(|n| (*n).to_owned())).collect();
        }
        let mut counts = Sharding::SHARD_COUNTS.to_vec();
        for &(_, shards) in self.cells.keys() {
            if !counts.contains(&shards) {
                counts.push(shards);
            }
        }
        counts.into_iter().map(|k| (k, format!("K={k}"))).collect()
    }

    /// Adds one run.
    pub fn add(&mut self, outcome: &RunOutcome) {
        for violation in &outcome.violations {
            *self.properties.entry(violation.property).or_default() += 1;
        }
        self.add_row(
            &outcome.options,
            &outcome.measurements,
            outcome.violations.len(),
        );
    }

    /// Adds a run of `options` that panicked: one violation, nothing measured.
    pub fn add_panic(&mut self, options: &RunOptions) {
        *self.properties.entry(Property::Harness).or_default() += 1;
        self.add_row(options, &Measurements::default(), 1);
    }

    fn add_row(&mut self, options: &RunOptions, measured: &Measurements, violations: usize) {
        let kind = options.kind;
        let cell = self.cells.entry((kind, column(options))).or_default();
        cell.runs += 1;
        cell.violations += violations as u64;
        let row = Row {
            runs: 1,
            measured: *measured,
            violations: violations as u64,
        };
        self.rows.entry(kind).or_default().merge(&row);
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

    /// The cells of the cell table that no run reached, in table order: `kind × column`
    /// (`partition × queue+fencing`, `crash × K=8`).
    pub fn empty_cells(&self) -> Vec<String> {
        let columns = self.columns();
        let cells = self
            .space
            .kinds()
            .into_iter()
            .flat_map(|kind| columns.iter().map(move |(key, name)| (kind, *key, name)));
        cells
            .filter(|(kind, key, _)| !self.cells.contains_key(&(*kind, *key)))
            .map(|(kind, _, name)| format!("{kind} × {name}"))
            .collect()
    }

    /// The largest values over every run.
    pub fn maxima(&self) -> Measurements {
        self.all().measured
    }

    /// Every row summed.
    fn all(&self) -> Row {
        let mut all = Row::default();
        for row in self.rows.values() {
            all.merge(row);
        }
        all
    }

    /// The runs and violations of the cell of `kind` and `column`; zero runs where none ran.
    fn count(&self, kind: RunKind, column: u32) -> Count {
        self.cells.get(&(kind, column)).copied().unwrap_or_default()
    }

    /// The line of violations by property, if any.
    fn write_properties(&self, out: &mut String) {
        if !self.properties.is_empty() {
            let list: Vec<String> = self
                .properties
                .iter()
                .map(|(property, count)| format!("{property} {count}"))
                .collect();
            let _ = writeln!(out, "violations by property: {}", list.join(", "));
        }
    }
}

fn cell(value: Option<Duration>) -> String {
    value.map_or_else(|| "-".to_owned(), |d| d.as_millis().to_string())
}

impl fmt::Display for Report {
    /// The tables, then the summary line `seeds: N, violations: V`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        if self.space.is_sharded() {
            self.write_sharded(&mut out, self.replicas);
        } else {
            self.write_single(&mut out);
        }
        write!(
            out,
            "seeds: {}, violations: {}",
            self.seeds, self.violations
        )?;
        f.write_str(&out)
    }
}

impl Report {
    /// The single election's tables.
    fn write_single(&self, out: &mut String) {
        let p = &self.params;
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
            format!("({})", self.space.mechanism().overlap_bound(p).as_millis()),
            format!("({})", p.gap_bound_of(self.probing).as_millis()),
            format!(
                "({})",
                self.space.mechanism().detection_bound(p).as_millis()
            ),
            if self.space.mechanism().holds_session() {
                format!("({})", p.orphan_bound().as_millis())
            } else {
                "(-)".to_owned()
            },
            "(-)",
            ""
        );
        if !self.space.mechanism().holds_session() {
            let _ = writeln!(
                out,
                "lease: TTL {} ms (trusted for 0.9 TTL after sending a renewal); handover after a lost leader <= TTL + gap = {} ms from its last renewal; detection: a term past its lease's end on the server",
                p.lease_ttl().as_millis(),
                p.lease_handover_bound().as_millis()
            );
            let headroom = self.all().measured.lease_headroom;
            let _ = writeln!(
                out,
                "lease clocks: within ±5 % (one replica 5 % slow, one 5 % fast; margin 10 %), all 15 % slow with --sabotage slow-clock; least headroom of a term before its lease expired on the server: {}",
                headroom.map_or_else(
                    || "-".to_owned(),
                    |h| format!("{:.1} ms", h.as_secs_f64() * 1e3)
                )
            );
        }
        for (kind, row) in &self.rows {
            write_row(out, kind.name(), row);
        }
        let all = self.all();
        write_row(out, "all", &all);
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
        self.write_properties(out);
        self.write_cells(out);
    }

    /// The cell table: per run kind (every one, run or not) and column, `runs/violations`;
    /// `EMPTY` where no run reached the cell; then how many cells ran and which did not.
    fn write_cells(&self, out: &mut String) {
        let of = if self.space.is_sharded() {
            "number of shards"
        } else {
            "acquire mode, fencing off and on"
        };
        let _ = writeln!(out, "runs/violations per kind and {of} (EMPTY: never run)");
        let columns = self.columns();
        let widths: Vec<usize> = columns.iter().map(|(_, n)| (n.len() + 2).max(9)).collect();
        let _ = write!(out, "{:<17}", "fault kind");
        for ((_, name), width) in columns.iter().zip(&widths) {
            let _ = write!(out, " {name:>width$}");
        }
        let _ = writeln!(out);
        let mut all = vec![Count::default(); columns.len()];
        let kinds = self.space.kinds();
        for &kind in &kinds {
            let counts: Vec<Count> = columns.iter().map(|(k, _)| self.count(kind, *k)).collect();
            for (sum, count) in all.iter_mut().zip(&counts) {
                sum.runs += count.runs;
                sum.violations += count.violations;
            }
            write_cells_row(out, kind.name(), &counts, &widths);
        }
        write_cells_row(out, "all", &all, &widths);
        let empty = self.empty_cells();
        let cells = kinds.len() * columns.len();
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

fn write_cells_row(out: &mut String, name: &str, counts: &[Count], widths: &[usize]) {
    let text = |count: &Count| {
        if count.runs == 0 {
            "EMPTY".to_owned()
        } else {
            format!("{}/{}", count.runs, count.violations)
        }
    };
    let _ = write!(out, "{name:<17}");
    for (count, width) in counts.iter().zip(widths) {
        let _ = write!(out, " {:>width$}", text(count));
    }
    let _ = writeln!(out);
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
        let mut report = Report::new(Space::Advisory, Params::default(), 3);
        report.add(&clean(RunOptions::new(130_000)));
        report.add_panic(&RunOptions::new(30_000));
        let text = report.to_string();
        assert_eq!(text.lines().last(), Some("seeds: 2, violations: 1"));
        assert!(text.contains("\nmixed "), "{text}");
        assert!(text.contains("\ncrash "), "{text}");
    }

    /// A cell no run reached reads EMPTY in its row, every kind has a row whether it ran or
    /// not, and the count of cells run names the empty ones.
    #[test]
    fn an_empty_cell_reads_empty_and_is_named_under_the_table() {
        let mut report = Report::new(Space::Advisory, Params::default(), 3);
        // Partition seed 0 polls, 1 queues, 2 polls and fences; queue+fencing (3) missing.
        for seed in [0, 1, 2] {
            report.add(&clean(RunOptions::new(seed)));
        }
        report.add_panic(&RunOptions::new(4));
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
        let mut report = Report::new(Space::Advisory, Params::default(), 3);
        for position in 1000..1000 + RunOptions::CYCLE {
            report.add(&clean(RunOptions::new(Space::Advisory.seed_at(position))));
        }
        let text = report.to_string();
        assert_eq!(report.empty_cells(), Vec::<String>::new());
        assert!(text.contains("\ncells run: 56 of 56\n"), "{text}");
        for kind in Space::Advisory.kinds() {
            assert_eq!(cells_row(&text, kind.name()), ["1/0"; 4], "{text}");
        }
    }

    #[test]
    fn a_few_empty_cells_are_all_named() {
        let mut report = Report::new(Space::Advisory, Params::default(), 3);
        for seed in Space::Advisory.seeds(RunOptions::CYCLE - 2) {
            report.add(&clean(RunOptions::new(seed)));
        }
        assert!(
            report.to_string().contains(
                "\ncells run: 54 of 56; EMPTY: resign × queue+fencing, mixed × queue+fencing\n"
            ),
            "{report}"
        );
    }

    #[test]
    fn a_lease_report_has_the_lease_bounds_and_two_columns_that_one_lease_cycle_fills() {
        let mut report = Report::new(Space::Lease, Params::default(), 3);
        for seed in Space::Lease.seeds(RunOptions::LEASE_CYCLE) {
            report.add(&clean(RunOptions::lease(seed)));
        }
        let text = report.to_string();
        assert_eq!(report.empty_cells(), Vec::<String>::new());
        assert!(text.contains("\ncells run: 28 of 28\n"), "{text}");
        assert!(text.contains(" lease   lease+fencing\n"), "{text}");
        assert_eq!(cells_row(&text, "partition"), ["1/0", "1/0"], "{text}");
        let bounds = cells_row(&text, "(bound)");
        assert_eq!(bounds, ["(0)", "(152)", "(0)", "(-)", "(-)"], "{text}");
        assert!(text.contains("TTL 300 ms"), "{text}");
    }
}
