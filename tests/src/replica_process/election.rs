//! The election's layer on [`ReplicaProcess`]: `lead` / `follow` records, who leads, and the
//! server-side checks that a scenario left no session and no lock behind.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::Client;

use super::{Record, ReplicaProcess};
use crate::{HarnessError, LOCK_CLASSID, LOCK_OBJID, Timeline};

/// `application_name` prefix of every replica process's sessions (distinct from the harness's
/// own [`crate::HARNESS_APP_PREFIX`]).
pub const REPLICA_APP_PREFIX: &str = "plx-replica-";

/// The record (and [`Timeline`] event) of a term's start.
pub const LEAD: &str = "lead";
/// The record (and [`Timeline`] event) of a term's end.
pub const FOLLOW: &str = "follow";

/// Records `record` in `timeline` when it is a `lead` or a `follow`.
pub(super) fn to_timeline(timeline: &Timeline, record: &Record) {
    if record.event == LEAD || record.event == FOLLOW {
        timeline.record_at(record.at, record.replica.clone(), record.event.clone());
    }
}

impl ReplicaProcess {
    /// Whether the replica's last `lead` / `follow` was a `lead`.
    pub fn is_leader(&self) -> bool {
        let records = self.shared.lock();
        records
            .iter()
            .rev()
            .find(|r| r.event == LEAD || r.event == FOLLOW)
            .is_some_and(|r| r.event == LEAD)
    }

    /// The `lead` records: one per term.
    pub fn terms(&self) -> Vec<Record> {
        self.events(LEAD)
    }

    /// The `follow` (cause `Killed`, at `at`) a killed leader did not print.
    pub(super) fn killed_follow(&self, at: Instant) -> Option<Record> {
        self.is_leader().then(|| Record {
            at,
            replica: self.name.clone(),
            event: FOLLOW.into(),
            fields: serde_json::json!({ "cause": "Killed" }),
        })
    }
}

/// Indexes of the replicas whose last event is `lead`.
pub fn leaders(replicas: &[ReplicaProcess]) -> Vec<usize> {
    (0..replicas.len())
        .filter(|&i| replicas[i].is_leader())
        .collect()
}

/// Waits (at most `timeout`) until exactly one replica leads and returns its index. It looks
/// again at each new record of any replica, nothing in between.
pub async fn wait_sole_leader(replicas: &[ReplicaProcess], timeout: Duration) -> Option<usize> {
    let deadline = Instant::now() + timeout;
    let sole = || match leaders(replicas)[..] {
        [one] => Some(one),
        _ => None,
    };
    // One forwarder per replica turns its record counter's changes into a wake-up; they end
    // with their process's reader, and are aborted when this returns.
    let (wake, mut woken) = tokio::sync::mpsc::channel::<()>(1);
    let mut forwarders = tokio::task::JoinSet::new();
    for replica in replicas {
        let (mut changed, wake) = (replica.shared.changed.subscribe(), wake.clone());
        forwarders.spawn(async move {
            while changed.changed().await.is_ok() {
                if wake.send(()).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(wake);
    loop {
        if let Some(one) = sole() {
            return Some(one);
        }
        match tokio::time::timeout_at(deadline, woken.recv()).await {
            Ok(Some(())) => {}
            // Every reader ended (the processes exited): nothing more will change.
            Ok(None) => return sole(),
            Err(_) => return None,
        }
    }
}

/// The sessions of the current database whose `application_name` starts with `prefix`.
///
/// # Errors
/// The query failed.
pub async fn session_names(client: &Client, prefix: &str) -> Result<Vec<String>, HarnessError> {
    let rows = client
        .query(
            "SELECT application_name FROM pg_stat_activity \
             WHERE datname = current_database() AND starts_with(application_name, $1) \
               AND pid <> pg_backend_pid()",
            &[&prefix],
        )
        .await?;
    rows.iter()
        .map(|row| Ok(row.try_get(0)?))
        .collect::<Result<_, HarnessError>>()
}

/// The backends that hold the leader lock in the current database, with their
/// `application_name` (an elector's identity, without its ` since <grant time>`).
///
/// # Errors
/// The query failed.
pub async fn lock_holders(client: &Client) -> Result<Vec<(i32, String)>, HarnessError> {
    let rows = client
        .query(
            "SELECT l.pid, coalesce(a.application_name, '') FROM pg_locks l \
             LEFT JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND l.classid = $1::int4::oid \
               AND l.objid = $2::int4::oid AND l.objsubid = 2 AND l.granted \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[&LOCK_CLASSID, &LOCK_OBJID],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let name: String = row.try_get(1)?;
            Ok((row.try_get(0)?, crate::observer::leader_name(&name)))
        })
        .collect::<Result<_, HarnessError>>()
}

/// After a scenario: waits up to `timeout` until no session of the replicas (`prefix`) is left
/// and no backend holds the leader lock.
///
/// # Errors
/// What was still there on timeout.
pub async fn wait_clean(client: &Client, prefix: &str, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let sessions = session_names(client, prefix).await;
        let holders = lock_holders(client).await;
        match (sessions, holders) {
            (Ok(s), Ok(h)) if s.is_empty() && h.is_empty() => return Ok(()),
            (s, h) if Instant::now() >= deadline => {
                return Err(format!(
                    "after {timeout:?}: replica sessions {s:?}, lock holders {h:?}"
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
