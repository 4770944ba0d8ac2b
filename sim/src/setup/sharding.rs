//! Sharded runs: the replicas run the real [`ShardedElector`](plexsphere_leader::sharded)
//! instead of the single election, over a space of K shards.
//!
//! # What a sharded seed runs
//!
//! Sharded seeds are a seed space of their own (`--sharded`, [`Space::Sharded`]): the seed
//! names its run kind by code, as every seed does
//! ([`RunKind::of_seed`](super::RunKind::of_seed)), among the kinds that apply to sharded
//! runs ([`RunKind::applies_to`](super::RunKind::applies_to)), and its run number n picks
//! the number of shards from [`Sharding::SHARD_COUNTS`], `n % 3`: 8 (three replicas own 3,
//! 3 and 2), 2 (fewer shards than replicas: one owns none) and 12 (4 each; 6 each while one
//! is down). Any [`Sharding::CYCLE`] consecutive seeds of the space run every (kind, K) cell
//! once. The class id
//! of the space is the adapter's default for one seed in three and drawn from the seed
//! otherwise (negative ones included, which `pg_locks` shows as large `oid`s).

use plexsphere_leader::sharded::DEFAULT_SHARD_CLASS;
use plexsphere_leader_core::CheckInterval;
use plexsphere_leader_core::shards::ShardOptions;

use super::kinds::{Space, run_number};
use super::params::Params;

/// The shard space of a sharded run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sharding {
    /// The number of shards, K.
    pub shards: u32,
}

impl Sharding {
    /// The shard counts the seeds cycle through, in the order of their variant digit.
    pub const SHARD_COUNTS: [u32; 3] = [8, 2, 12];

    /// Within this many consecutive sharded seeds every (kind, K) cell runs once.
    pub const CYCLE: u64 = Space::Sharded.cycle();

    /// The space of sharded seed `seed`: K from its run number n, `n % 3`.
    pub fn for_seed(seed: u64) -> Self {
        let variant = run_number(seed) % Self::SHARD_COUNTS.len() as u64;
        Self {
            shards: Self::SHARD_COUNTS[usize::try_from(variant).unwrap_or(0)],
        }
    }

    /// The elector's move limit per interval with its default options at the check interval
    /// of `params` (a quarter of the space, rounded up).
    pub fn moves(self, params: Params) -> u32 {
        CheckInterval::new(params.interval)
            .ok()
            .and_then(|interval| ShardOptions::new(interval, self.shards).ok())
            .map_or(1, |options| options.moves())
    }

    /// The class id of the space in the run of `seed`: the adapter's default for one seed in
    /// three, else one drawn from the seed (possibly negative).
    pub fn class(seed: u64) -> i32 {
        if seed.is_multiple_of(3) {
            return DEFAULT_SHARD_CLASS;
        }
        let mixed = seed.wrapping_mul(0xd6e8_feb8_6659_fd93).to_be_bytes();
        i32::from_be_bytes([mixed[0], mixed[1], mixed[2], mixed[3]])
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::setup::RunKind;

    #[test]
    fn any_cycle_of_sharded_seeds_runs_every_kind_with_every_shard_count() {
        for start in (0..2 * Sharding::CYCLE).chain([1_000, 77_777]) {
            let cells: BTreeSet<(Option<RunKind>, u32)> = (start..start + Sharding::CYCLE)
                .map(|position| Space::Sharded.seed_at(position))
                .map(|seed| (RunKind::of_seed(seed), Sharding::for_seed(seed).shards))
                .collect();
            assert_eq!(cells.len() as u64, Sharding::CYCLE, "seeds from {start}");
        }
    }

    #[test]
    fn classes_are_the_default_or_drawn_and_sometimes_negative() {
        assert_eq!(Sharding::class(0), DEFAULT_SHARD_CLASS);
        let drawn: Vec<i32> = (1..40).map(Sharding::class).collect();
        assert!(drawn.iter().any(|c| *c < 0));
        assert!(drawn.iter().any(|c| *c > 0 && *c != DEFAULT_SHARD_CLASS));
    }
}
