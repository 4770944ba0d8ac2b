//! The tables of sharded runs: per kind of fault, the runs, the largest measurements per
//! shard against their bounds and the violations; the cases measured, the moves, the
//! violations by property; then runs and violations per (kind, number of shards).

use std::fmt::Write as _;
use std::time::Duration;

use super::{Report, Row, cell};
use crate::setup::Sharding;

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
    let (m, shard) = (&row.measured, &row.measured.shards);
    line(
        out,
        [
            name,
            &row.runs.to_string(),
            &row.measured.faults.to_string(),
            &cell(m.overlap),
            &cell(m.detection),
            &cell(m.orphan_idle),
            &cell(m.gap),
            &cell(shard.ghost_gap),
            &cell(shard.leaderless),
            &cell(shard.balance),
            &row.violations.to_string(),
        ],
    );
}

impl Report {
    /// The tables of sharded runs of `replicas` replicas each.
    pub(super) fn write_sharded(&self, out: &mut String, replicas: usize) {
        let p = &self.params;
        let mechanism = self.space.mechanism();
        let _ = writeln!(
            out,
            "sharded{}: {replicas} replicas; I = {} ms, T = {} ms, tick = {} ms, latency <= {} ms; maxima per shard in ms (bound)",
            if mechanism.holds_session() {
                ""
            } else {
                " over leases"
            },
            p.interval.as_millis(),
            p.longest_work.as_millis(),
            p.tick.as_millis(),
            p.max_latency.as_millis()
        );
        line(out, HEADER);
        let bound = |d: Duration| format!("({})", d.as_millis());
        let balance = Sharding::SHARD_COUNTS
            .iter()
            .map(|&shards| {
                let sharding = Sharding { shards };
                p.balance_bound(shards, replicas, sharding.moves(*p))
            })
            .max()
            .unwrap_or_default();
        line(
            out,
            [
                "(bound)",
                "",
                "",
                &bound(mechanism.overlap_bound(p)),
                &bound(mechanism.detection_bound(p)),
                &if mechanism.holds_session() {
                    bound(p.orphan_bound())
                } else {
                    "(-)".to_owned()
                },
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
        for (kind, row) in &self.rows {
            write_row(out, kind.name(), row);
        }
        let all = self.all();
        write_row(out, "all", &all);
        let (all, m) = (all.measured, all.measured.shards);
        let _ = writeln!(
            out,
            "cases measured: {} shard terms, {} overlaps, {} detections, {} idle periods of members, {} free shards re-owned ({} with a ghost, a leave or a join in the window), {} handovers and {} stops checked against their work",
            all.terms,
            all.cases.overlaps,
            all.cases.detections,
            all.cases.idle_periods,
            all.cases.gaps + m.ghost_gaps,
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
        self.write_properties(out);
        self.write_cells(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::RunOutcome;
    use crate::setup::{Params, RunOptions, Space};

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
        let mut report = Report::new(Space::Sharded, Params::default(), 3);
        for position in 500..500 + Sharding::CYCLE {
            report.add(&clean(RunOptions::sharded(
                Space::Sharded.seed_at(position),
            )));
        }
        report.add_panic(&RunOptions::sharded(70_000));
        assert_eq!(report.empty_cells(), Vec::<String>::new());
        let text = report.to_string();
        assert!(text.contains("\ncells run: 42 of 42\n"), "{text}");
        assert!(text.contains("violations by property: harness 1"), "{text}");
        assert_eq!(text.lines().last(), Some("seeds: 43, violations: 1"));
    }
}
