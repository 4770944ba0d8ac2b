//! The lease's tenures, from the servers' ground truth, for the single-election checker.
//!
//! A tenure of the lease begins with a claim (`Event::LeaseClaimed`) and ends with its
//! holder's release (`Event::LeaseReleased`), or when it expires on the server's clock
//! without a renewal before (the claim's or the last renewal's expiry), or with its own
//! holder's next claim (which starts a tenure of its own, with its own epoch). A renewal of
//! an expired lease that no one claimed in between revives it: a new tenure from the renewal.
//! The lease lives in the committed tables, which follow a failover to the synchronous
//! standby, so one tenure may go on over both servers; what a deposed server logs (its own
//! timeline) is left out. A claim by another holder while a tenure runs is a broken mutual
//! exclusion of the server itself.

use std::collections::BTreeMap;
use std::time::Duration;

use plexsphere_leader_pgsim::Event;

use super::space::Tenure;
use super::{Owner, Property, ServerEvidence, Violation, secs};
use crate::record::{History, holder_identity};
use crate::setup::SERVERS;

/// One change of the lease row, as a server logged it.
struct Change<'e> {
    at: Duration,
    server: usize,
    pid: i32,
    holder: &'e str,
    what: What,
}

enum What {
    Claimed { expires: Duration },
    Renewed { expires: Duration },
    Released,
}

/// The running tenure: its record, its holder, and when it expires.
struct Running<'e> {
    tenure: Tenure,
    holder: &'e str,
    expires: Duration,
}

/// Every tenure of the lease in claim order, and the server's double claims.
pub(super) fn tenures(
    servers: &[ServerEvidence],
    owners: &[BTreeMap<i32, Owner>],
    history: &History,
) -> (Vec<Tenure>, Vec<Violation>) {
    let mut tenures = Vec::new();
    let mut violations = Vec::new();
    let mut running: Option<Running<'_>> = None;
    for change in changes(servers, history) {
        // An expiry before this change ended the running tenure.
        if let Some(run) = running.take_if(|run| run.expires <= change.at) {
            tenures.push(ended(run.tenure, run.expires, false));
        }
        let start = |expires| Running {
            tenure: Tenure::granted(change.server, change.pid, &owners[change.server], change.at),
            holder: change.holder,
            expires,
        };
        match change.what {
            What::Claimed { expires } => {
                if let Some(run) = running.take() {
                    if run.holder != change.holder {
                        violations.push(double_claim(&change, &run));
                    }
                    tenures.push(ended(run.tenure, change.at, true));
                }
                running = Some(start(expires));
            }
            What::Renewed { expires } => match running.as_mut() {
                Some(run) if run.holder == change.holder => run.expires = expires,
                Some(_) => {}
                None => running = Some(start(expires)),
            },
            What::Released => {
                if let Some(run) = running.take_if(|run| run.holder == change.holder) {
                    tenures.push(ended(run.tenure, change.at, true));
                }
            }
        }
    }
    if let Some(run) = running {
        let ends = (run.expires <= history.end).then_some(run.expires);
        tenures.push(match ends {
            Some(at) => ended(run.tenure, at, false),
            None => run.tenure,
        });
    }
    tenures.sort_by_key(|t| (t.granted, t.server, t.pid));
    (tenures, violations)
}

/// Every event a server logged while it was the primary, with its time and server, in time
/// order (one server's log order within an instant): the committed rows' history, which
/// follows a failover.
fn primary_events<'e>(
    servers: &'e [ServerEvidence],
    history: &History,
) -> Vec<(Duration, usize, &'e Event)> {
    let mut events: Vec<(Duration, usize, &Event)> = super::logged(servers)
        .filter(|(server, entry)| history.primary_at(entry.at) == *server)
        .map(|(server, entry)| (entry.at, server, &entry.event))
        .collect();
    // Stable: within an instant each server's log order stays.
    events.sort_by_key(|(at, server, _)| (*at, *server));
    events
}

/// Every change of the lease row on the server that was the primary when it logged it, in
/// time order (one server's log order within an instant).
fn changes<'e>(servers: &'e [ServerEvidence], history: &History) -> Vec<Change<'e>> {
    let mut changes = Vec::new();
    for (at, server, event) in primary_events(servers, history) {
        let (pid, holder, what) = match event {
            Event::LeaseClaimed {
                pid,
                holder,
                expires,
                ..
            } => (pid, holder, What::Claimed { expires: *expires }),
            Event::LeaseRenewed {
                pid,
                holder,
                expires,
                ..
            } => (pid, holder, What::Renewed { expires: *expires }),
            Event::LeaseReleased { pid, holder, .. } => (pid, holder, What::Released),
            _ => continue,
        };
        changes.push(Change {
            at,
            server,
            pid: *pid,
            holder,
            what,
        });
    }
    changes
}

/// `tenure` ended at `at`; `by_its_holder` when its own replica ended it (a release, or its
/// next claim), not its expiry.
fn ended(mut tenure: Tenure, at: Duration, by_its_holder: bool) -> Tenure {
    tenure.released = Some(at);
    tenure.unlocked = by_its_holder;
    tenure
}

fn double_claim(change: &Change<'_>, run: &Running<'_>) -> Violation {
    Violation {
        at: change.at,
        property: Property::MutualExclusion,
        detail: format!(
            "{}: the lease was claimed by pid {} for {} while {}'s ran until {}",
            SERVERS[change.server],
            change.pid,
            holder_identity(change.holder),
            holder_identity(run.holder),
            secs(run.expires)
        ),
    }
}

/// A lease shard space's tenures, from the servers' ground truth (what the primary of the
/// moment logged; the rows follow a failover): a member's tenure runs from its registration
/// to its leave or its expiry on the server's clock (the registration's or the last
/// renewal's; the server renews nothing expired), a shard's from a take for a member to its
/// release by that member (a release, a leave) or the member's expiry, whichever comes first.
pub(super) struct ShardTenures {
    /// Every tenure of each shard below the space's count, in take order.
    pub(super) shards: BTreeMap<u32, Vec<Tenure>>,
    /// Every member's tenure, in registration order.
    pub(super) members: Vec<Tenure>,
    /// A take of a shard while another live member owned it: the server's mutual exclusion
    /// broken.
    pub(super) violations: Vec<Violation>,
}

/// The tenures of lease shard space `class` of `count` shards (see [`ShardTenures`]).
pub(super) fn shard_tenures(
    servers: &[ServerEvidence],
    owners: &[BTreeMap<i32, Owner>],
    history: &History,
    class: i32,
    count: u32,
) -> ShardTenures {
    // Each member's tenure and expiry; each shard's running tenure and its member.
    let mut members: BTreeMap<i32, (Tenure, Duration)> = BTreeMap::new();
    let mut running: BTreeMap<u32, (Tenure, i32)> = BTreeMap::new();
    let mut out = ShardTenures {
        shards: BTreeMap::new(),
        members: Vec::new(),
        violations: Vec::new(),
    };
    let end_of = |members: &BTreeMap<i32, (Tenure, Duration)>, member: i32| {
        members
            .get(&member)
            .map_or(Duration::ZERO, |(tenure, expires)| {
                tenure.released.unwrap_or(*expires)
            })
    };
    for (at, server, event) in primary_events(servers, history) {
        // A running shard tenure whose member expired before this change ended then.
        running.retain(|shard, (tenure, member)| {
            let ends = end_of(&members, *member);
            if ends <= at {
                let tenure = ended(*tenure, ends, false);
                out.shards.entry(*shard).or_default().push(tenure);
                return false;
            }
            true
        });
        let granted = |pid: i32| Tenure::granted(server, pid, &owners[server], at);
        match *event {
            Event::MemberLive {
                pid,
                class: c,
                member,
                expires,
                joined,
                ..
            } if c == class => {
                if joined {
                    members.insert(member, (granted(pid), expires));
                } else if let Some((_, until)) = members.get_mut(&member) {
                    *until = expires;
                }
            }
            Event::MemberGone {
                class: c,
                member,
                reaped,
                ..
            } if c == class => {
                if let Some((tenure, expires)) = members.get_mut(&member)
                    && tenure.released.is_none()
                {
                    *tenure = ended(*tenure, at.min(*expires), !reaped);
                }
            }
            Event::ShardOwned {
                pid,
                class: c,
                member,
                shard,
            } if c == class && shard < count => {
                if let Some((tenure, holder)) = running.remove(&shard) {
                    if holder != member {
                        out.violations.push(Violation {
                            at,
                            property: Property::MutualExclusion,
                            detail: format!(
                                "{}: shard {shard} was taken by pid {pid} for member {member} while member {holder} (pid {}), live until {}, owned it",
                                SERVERS[server],
                                tenure.pid,
                                secs(end_of(&members, holder))
                            ),
                        });
                    }
                    out.shards
                        .entry(shard)
                        .or_default()
                        .push(ended(tenure, at, true));
                }
                running.insert(shard, (granted(pid), member));
            }
            Event::ShardFreed {
                pid,
                class: c,
                shard,
                member,
            } if c == class => {
                let owned = running.get(&shard).is_some_and(|(_, m)| *m == member);
                if let Some((tenure, _)) = running.remove(&shard).filter(|_| owned) {
                    // Its own replica's release or leave; a reap ended it at the expiry.
                    let own = owners[server].get(&pid).copied() == tenure.owner;
                    let at = if own {
                        at
                    } else {
                        at.min(end_of(&members, member))
                    };
                    out.shards
                        .entry(shard)
                        .or_default()
                        .push(ended(tenure, at, own));
                }
            }
            _ => {}
        }
    }
    for (shard, (tenure, member)) in running {
        let ends = end_of(&members, member);
        let tenure = if ends <= history.end {
            ended(tenure, ends, false)
        } else {
            tenure
        };
        out.shards.entry(shard).or_default().push(tenure);
    }
    for (_, (tenure, expires)) in members {
        out.members.push(match tenure.released {
            None if expires <= history.end => ended(tenure, expires, false),
            _ => tenure,
        });
    }
    for tenures in out.shards.values_mut() {
        tenures.sort_by_key(|t| (t.granted, t.server, t.pid));
    }
    out.members.sort_by_key(|t| (t.granted, t.server, t.pid));
    out
}
