//! The sharded mode: one [`ShardedElector`] for the whole space (advisory locks, or with
//! `--mechanism lease` lease rows of the default TTL), printing `member`, `begin` and
//! `end` from its published ownership ([`ShardedElector::subscribe`]) and transitions
//! ([`ShardedElector::transitions`], each end's instant and cause).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use plexsphere_leader::leadership::TermId;
use plexsphere_leader::sharded::ShardedElector;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{ChildArgs, Controls, Mechanism, Out, commands};
use crate::clock::monotonic_ns;

/// Runs the sharded elector of `shards` until `shutdown`, then prints the `exit` record.
pub(super) async fn run(
    args: &ChildArgs,
    shards: u32,
    out: &Arc<Out>,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let pool = args.pool(&args.session_config()?)?;
    let mut config = pool
        .shard_config(shards)
        .class(args.class)
        .check_interval(args.interval)
        .identity(&args.name);
    if args.mechanism == Mechanism::Lease {
        config = config.lease(Duration::ZERO);
    }
    let elector = ShardedElector::new(config).map_err(|e| e.to_string())?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    tokio::spawn(follow_ownership(
        elector.clone(),
        Arc::clone(out),
        Arc::clone(&seen),
    ));
    tokio::spawn(commands(
        Arc::clone(out),
        shutdown.clone(),
        Controls::Sharded,
    ));
    out.ready_of_space(args, shards, "sharded");
    let result = elector.run(shutdown).await;
    // The last terms' ends before the exit record, whether or not the follower woke yet.
    emit_ownership(out, &seen, &elector);
    let errors: Vec<String> = result.err().map(|e| e.to_string()).into_iter().collect();
    out.exit_of_runs(&errors);
    Ok(())
}

/// What the follower already printed: the open terms by shard, and the member.
#[derive(Debug, Default)]
struct Seen {
    terms: BTreeMap<u32, TermId>,
    member: Option<i32>,
}

/// Prints `member`, `begin` and `end` for every change of the published ownership.
async fn follow_ownership(elector: ShardedElector, out: Arc<Out>, seen: Arc<Mutex<Seen>>) {
    let mut published = elector.subscribe();
    loop {
        published.borrow_and_update();
        emit_ownership(&out, &seen, &elector);
        if published.changed().await.is_err() {
            return;
        }
    }
}

/// Emits what the elector's ownership shows that was not emitted yet: ends first (stamped and
/// explained by the transitions), then the member, then begins.
fn emit_ownership(out: &Out, seen: &Mutex<Seen>, elector: &ShardedElector) {
    let ownership = elector.ownership();
    let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    let ended: Vec<(u32, TermId)> = seen
        .terms
        .iter()
        .filter(|(shard, term)| ownership.shards.get(shard).map(|o| o.term) != Some(**term))
        .map(|(s, t)| (*s, *t))
        .collect();
    if !ended.is_empty() {
        let transitions = elector.transitions();
        for (shard, term) in ended {
            seen.terms.remove(&shard);
            let transition = transitions
                .iter()
                .rev()
                .find(|t| t.shard == shard && t.term == term && t.ended.is_some());
            let (stamp, cause) = match transition.and_then(|t| Some((t.at, t.ended?))) {
                Some((at, cause)) => (stamp_of_wall(at), format!("{cause:?}")),
                None => (monotonic_ns(), "EndedBeforeObserved".to_owned()),
            };
            out.emit_at(
                stamp,
                "end",
                json!({ "shard": shard, "term": term.get(), "cause": cause }),
            );
        }
    }
    if ownership.member != seen.member {
        seen.member = ownership.member;
        out.emit("member", json!({ "member": ownership.member }));
    }
    for (shard, owned) in &ownership.shards {
        if seen.terms.get(shard) != Some(&owned.term) {
            seen.terms.insert(*shard, owned.term);
            out.emit_at(
                stamp_of_wall(owned.since),
                "begin",
                json!({ "shard": shard, "term": owned.term.get() }),
            );
        }
    }
}

/// The `CLOCK_MONOTONIC` stamp of a wall-clock instant, by its distance from now (a wall-clock
/// step in between would shift it; none is expected within milliseconds).
fn stamp_of_wall(at: SystemTime) -> u64 {
    let now = monotonic_ns();
    match SystemTime::now().duration_since(at) {
        Ok(ago) => now.saturating_sub(u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX)),
        Err(_) => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_clock_instant_converts_to_a_monotonic_stamp_of_the_same_age() {
        let ago = Duration::from_millis(300);
        let stamp = stamp_of_wall(SystemTime::now() - ago);
        let age = monotonic_ns() - stamp;
        assert!(
            (299_000_000..400_000_000).contains(&age),
            "{age} ns instead of about 300 ms"
        );
    }
}
