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

/// Every change of the lease row on the server that was the primary when it logged it, in
/// time order (one server's log order within an instant).
fn changes<'e>(servers: &'e [ServerEvidence], history: &History) -> Vec<Change<'e>> {
    let mut changes = Vec::new();
    for (server, evidence) in servers.iter().enumerate() {
        for entry in &evidence.log {
            let (pid, holder, what) = match &entry.event {
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
            if history.primary_at(entry.at) != server {
                continue;
            }
            changes.push(Change {
                at: entry.at,
                server,
                pid: *pid,
                holder,
                what,
            });
        }
    }
    // Stable: within an instant each server's log order stays.
    changes.sort_by_key(|change| (change.at, change.server));
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
