//! The sharded space's layer on [`ReplicaProcess`]: the shards a process believes it owns,
//! and pure functions that replay the merged `begin` / `end` records into who owned which
//! shard when ([`shard_events`], [`owned_at`]), whether the space was balanced ([`balanced`],
//! [`settled_at`]) and whether two replicas ever believed they owned one shard
//! ([`max_shard_overlap`]); and the server's view ([`owners`], of locks or of leases).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use plexsphere_leader::lease::DEFAULT_SCHEMA;
use plexsphere_leader::rank::FloorStep;
use plexsphere_leader::shard_sql::{self, OwnerRow, lease};
use tokio::time::Instant;
use tokio_postgres::Client;

use super::{Record, ReplicaProcess};
use crate::Mechanism;
use crate::timeline::{self, Event};

/// The record of a shard term's start.
pub const BEGIN: &str = "begin";
/// The record of a shard term's end.
pub const END: &str = "end";

impl ReplicaProcess {
    /// The shards this replica believes it owns now, by the `begin` / `end` it printed.
    pub fn owned(&self) -> BTreeSet<u32> {
        let records = self.shared.lock();
        let mut owned = BTreeSet::new();
        for r in records.iter() {
            let Some(shard) = shard_of(r) else { continue };
            match r.event.as_str() {
                BEGIN => {
                    owned.insert(shard);
                }
                END => {
                    owned.remove(&shard);
                }
                _ => {}
            }
        }
        owned
    }

    /// The member id (lock session's backend pid) it printed last; `None` while it is none.
    pub fn member(&self) -> Option<i32> {
        let records = self.shared.lock();
        records
            .iter()
            .rev()
            .find(|r| r.event == "member")
            .and_then(|r| r.fields.get("member")?.as_i64())
            .and_then(|m| i32::try_from(m).ok())
    }

    /// The `end`s (cause `Killed`, at `at`) of the shards a killed process did not print.
    pub(super) fn killed_ends(&self, at: Instant) -> Vec<Record> {
        self.owned()
            .into_iter()
            .map(|shard| Record {
                at,
                replica: self.name.clone(),
                event: END.into(),
                fields: serde_json::json!({ "shard": shard, "cause": "Killed" }),
            })
            .collect()
    }
}

fn shard_of(record: &Record) -> Option<u32> {
    record
        .fields
        .get("shard")?
        .as_u64()
        .and_then(|s| u32::try_from(s).ok())
}

// ---------------------------------------------------------------------------------------------
// Ownership over time: pure functions of the merged records

/// A shard term that began or ended on one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardEvent {
    /// When, on the harness's clock.
    pub at: Instant,
    /// The replica.
    pub replica: String,
    /// The shard.
    pub shard: u32,
    /// `true` for a begin, `false` for an end.
    pub began: bool,
}

/// Every `begin` and `end` of `processes`, ordered by time (a replica's own order kept for
/// equal stamps).
pub fn shard_events(processes: &[&ReplicaProcess]) -> Vec<ShardEvent> {
    let mut events: Vec<ShardEvent> = processes
        .iter()
        .flat_map(|p| p.records())
        .filter_map(|r| {
            let began = match r.event.as_str() {
                BEGIN => true,
                END => false,
                _ => return None,
            };
            Some(ShardEvent {
                at: r.at,
                shard: shard_of(&r)?,
                replica: r.replica,
                began,
            })
        })
        .collect();
    events.sort_by_key(|e| e.at);
    events
}

/// Who believed they owned which shards after every event stamped at or before `at`.
pub fn owned_at(events: &[ShardEvent], at: Instant) -> BTreeMap<String, BTreeSet<u32>> {
    let mut owned: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for e in events.iter().take_while(|e| e.at <= at) {
        apply(&mut owned, e);
    }
    owned
}

fn apply(owned: &mut BTreeMap<String, BTreeSet<u32>>, e: &ShardEvent) {
    let shards = owned.entry(e.replica.clone()).or_default();
    if e.began {
        shards.insert(e.shard);
    } else {
        shards.remove(&e.shard);
    }
}

/// Whether `owned` is a balanced ownership of `k` shards by the `live` replicas: every shard
/// owned by exactly one of them, nobody else owning any, and each owning `⌊k/R⌋` or `⌈k/R⌉`.
pub fn balanced(owned: &BTreeMap<String, BTreeSet<u32>>, live: &[String], k: u32) -> bool {
    if live.is_empty() {
        return false;
    }
    let r = live.len();
    let (lo, hi) = (k as usize / r, (k as usize).div_ceil(r));
    let count = |name: &String| owned.get(name).map_or(0, BTreeSet::len);
    if !live.iter().all(|name| (lo..=hi).contains(&count(name))) {
        return false;
    }
    if owned
        .iter()
        .any(|(name, shards)| !shards.is_empty() && !live.contains(name))
    {
        return false;
    }
    let total: usize = live.iter().map(count).sum();
    let distinct: BTreeSet<u32> = live
        .iter()
        .filter_map(|name| owned.get(name))
        .flatten()
        .copied()
        .collect();
    total == k as usize && distinct.len() == total && distinct.iter().all(|s| *s < k)
}

/// When the ownership became balanced ([`balanced`]) for the last time in `[from, until]`, if
/// it is balanced at `until`: from then on it stayed balanced. `from` itself when it was
/// balanced throughout.
pub fn settled_at(
    events: &[ShardEvent],
    live: &[String],
    k: u32,
    from: Instant,
    until: Instant,
) -> Option<Instant> {
    balance_changes(events, live, k, from, until)
        .last()
        .and_then(|&(at, is_balanced)| is_balanced.then_some(at))
}

/// When the ownership was first balanced in `[from, until]`.
pub fn first_balanced_at(
    events: &[ShardEvent],
    live: &[String],
    k: u32,
    from: Instant,
    until: Instant,
) -> Option<Instant> {
    balance_changes(events, live, k, from, until)
        .into_iter()
        .find(|(_, is_balanced)| *is_balanced)
        .map(|(at, _)| at)
}

/// The instants in `[from, until]` at which [`balanced`] changed, with its new value; the
/// first entry is its value at `from`.
fn balance_changes(
    events: &[ShardEvent],
    live: &[String],
    k: u32,
    from: Instant,
    until: Instant,
) -> Vec<(Instant, bool)> {
    let mut owned = BTreeMap::new();
    let mut rest = events.iter().peekable();
    while let Some(e) = rest.next_if(|e| e.at <= from) {
        apply(&mut owned, e);
    }
    let mut changes = vec![(from, balanced(&owned, live, k))];
    while let Some(e) = rest.next_if(|e| e.at <= until) {
        apply(&mut owned, e);
        // Evaluate once every event of this instant is applied.
        if rest.peek().is_some_and(|next| next.at == e.at) {
            continue;
        }
        let now = balanced(&owned, live, k);
        if changes.last().is_some_and(|(_, was)| *was != now) {
            changes.push((e.at, now));
        }
    }
    changes
}

/// How many shard terms began in `(from, to]`: the shards that got an owner, counted once per
/// move (a shard moved twice counts twice).
pub fn begins_between(events: &[ShardEvent], from: Instant, to: Instant) -> usize {
    events
        .iter()
        .filter(|e| e.began && e.at > from && e.at <= to)
        .count()
}

/// How many shards have a different owner at `after` than at `before` (a shard owned by nobody
/// at one of them counts when it is owned at the other).
pub fn owners_changed(events: &[ShardEvent], before: Instant, after: Instant) -> usize {
    let owner_map = |at| -> BTreeMap<u32, String> {
        owned_at(events, at)
            .into_iter()
            .flat_map(|(name, shards)| shards.into_iter().map(move |s| (s, name.clone())))
            .collect()
    };
    let (a, b) = (owner_map(before), owner_map(after));
    let shards: BTreeSet<u32> = a.keys().chain(b.keys()).copied().collect();
    shards.iter().filter(|s| a.get(s) != b.get(s)).count()
}

/// The longest span in which two replicas believed they owned the same shard, and that shard;
/// terms still open end at `until`. `None` when no shard ever had two believed owners.
pub fn max_shard_overlap(events: &[ShardEvent], until: Instant) -> Option<(Duration, u32)> {
    let mut by_shard: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
    for e in events {
        by_shard.entry(e.shard).or_default().push(Event {
            at: e.at,
            replica: e.replica.clone(),
            event: if e.began { BEGIN } else { END }.to_owned(),
        });
    }
    by_shard
        .into_iter()
        .filter_map(|(shard, events)| {
            let intervals = timeline::intervals_from_events(&events, BEGIN, END, until);
            let spans = timeline::overlaps(&intervals);
            spans
                .iter()
                .map(timeline::Span::duration)
                .max()
                .map(|d| (d, shard))
        })
        .max()
}

// ---------------------------------------------------------------------------------------------
// The server's view

/// Who holds which shards of the space `class` of `count` shards, as the server shows them:
/// with advisory locks, `pg_locks` ([`shard_sql::owners`]); with leases, the live member rows
/// and their owner rows ([`lease::survey`] of [`DEFAULT_SCHEMA`]), each a member (`pid`: its
/// member id) named by the identity of its holder `<identity> <nonce>`.
pub async fn owners(
    client: &Client,
    mechanism: Mechanism,
    class: i32,
    count: u32,
) -> Result<Vec<OwnerRow>, String> {
    let statement = match mechanism {
        Mechanism::Advisory => shard_sql::owners(class, count),
        Mechanism::Lease => lease::survey(DEFAULT_SCHEMA, class, count, FloorStep::Off),
    };
    let rows = crate::simple_rows(client, &statement)
        .await
        .map_err(|e| e.to_string())?;
    match mechanism {
        Mechanism::Advisory => shard_sql::parse_owners(&rows).map_err(|e| e.to_string()),
        Mechanism::Lease => Ok(lease::parse_survey(&rows)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|row| {
                let (standing, holder) = shard_sql::standing::parse(&row.holder);
                OwnerRow {
                    pid: row.member,
                    name: Some(identity_of(holder).to_owned()),
                    member: true,
                    shards: row.shards,
                    rank: standing.rank,
                }
            })
            .collect()),
    }
}

/// The identity of a lease holder `<identity> <nonce>`.
fn identity_of(holder: &str) -> &str {
    holder
        .rsplit_once(' ')
        .map_or(holder, |(identity, _)| identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    fn event(t0: Instant, ms: u64, replica: &str, shard: u32, began: bool) -> ShardEvent {
        ShardEvent {
            at: t0 + Duration::from_millis(ms),
            replica: replica.into(),
            shard,
            began,
        }
    }

    #[test]
    fn balance_needs_every_shard_once_and_shares_within_one() {
        let live = names(&["a", "b"]);
        let mut owned: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        owned.insert("a".into(), [0, 1].into());
        owned.insert("b".into(), [2].into());
        assert!(balanced(&owned, &live, 3));
        // A shard owned twice.
        owned.insert("b".into(), [1, 2].into());
        assert!(!balanced(&owned, &live, 3));
        // 3 and 1 of 4: not within one.
        owned.insert("a".into(), [0, 1, 3].into());
        owned.insert("b".into(), [2].into());
        assert!(!balanced(&owned, &live, 4));
        // A replica outside the live set still owning a shard.
        owned.insert("a".into(), [0, 1].into());
        owned.insert("b".into(), [2, 3].into());
        owned.insert("gone".into(), [3].into());
        assert!(!balanced(&owned, &live, 4));
        owned.insert("gone".into(), BTreeSet::new());
        assert!(balanced(&owned, &live, 4));
    }

    #[test]
    fn settled_is_the_last_time_the_space_became_balanced() {
        let t0 = Instant::now();
        let live = names(&["a", "b"]);
        let events = vec![
            event(t0, 0, "a", 0, true),
            event(t0, 0, "a", 1, true),
            event(t0, 10, "b", 2, true),
            event(t0, 10, "b", 3, true),  // balanced at 10
            event(t0, 20, "b", 3, false), // not at 20
            event(t0, 30, "b", 3, true),  // again at 30
        ];
        let until = t0 + Duration::from_millis(100);
        assert_eq!(
            first_balanced_at(&events, &live, 4, t0, until),
            Some(t0 + Duration::from_millis(10))
        );
        assert_eq!(
            settled_at(&events, &live, 4, t0, until),
            Some(t0 + Duration::from_millis(30))
        );
        assert_eq!(
            settled_at(&events, &live, 4, t0, t0 + Duration::from_millis(25)),
            None
        );
        // The begins at t0 itself are not after it.
        assert_eq!(begins_between(&events, t0, until), 3);
        assert_eq!(owners_changed(&events, t0, until), 2);
    }

    #[test]
    fn a_lease_holder_is_named_by_its_identity() {
        assert_eq!(identity_of("plx-shard-03 9f2c41d0a7b3e655"), "plx-shard-03");
        assert_eq!(identity_of("svc@host 1 0f"), "svc@host 1");
        assert_eq!(identity_of("bare"), "bare");
    }

    #[test]
    fn an_overlap_is_two_replicas_believing_they_own_one_shard() {
        let t0 = Instant::now();
        let until = t0 + Duration::from_millis(100);
        let handover = vec![
            event(t0, 0, "a", 5, true),
            event(t0, 40, "a", 5, false),
            event(t0, 40, "b", 5, true),
        ];
        assert_eq!(max_shard_overlap(&handover, until), None);
        let overlap = vec![
            event(t0, 0, "a", 5, true),
            event(t0, 30, "b", 5, true),
            event(t0, 45, "a", 5, false),
        ];
        assert_eq!(
            max_shard_overlap(&overlap, until),
            Some((Duration::from_millis(15), 5))
        );
    }
}
