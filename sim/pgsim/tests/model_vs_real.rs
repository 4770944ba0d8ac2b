//! The model against the real thing: one scripted sequence of the statements the adapter sends
//! (grant, refusal, unlock true and false, the idle-session timeout's FATAL 57P05, and
//! `pg_terminate_backend`'s FATAL 57P01) runs against the simulated server under turmoil and
//! against the real PostgreSQL on 127.0.0.1:5432 (or `PLEXSPHERE_TEST_DSN`), in a database
//! created for the test and dropped after it. What the client observes must be the same.
//!
//! A second script does the same for the adapter's newer statements (`plexsphere_leader::sql`):
//! the grant outcomes `granted`/`refused`/`shared`, the leader's `verify()` columns before and
//! after an unlock, a queued wait that times out with 55P03 and one that is granted when the
//! holder disconnects, and the fencing statements on a fresh database.
//!
//! A third script checks the fence row's locks: a fence check (`SELECT … FOR SHARE`) in an open
//! transaction block makes another session's epoch advance wait until the block ends (and a
//! second check is granted while the advance waits), `lock_timeout` ends such a wait with
//! 55P03, a check outside a block holds nothing, a block bounded by `SET LOCAL
//! idle_in_transaction_session_timeout` ends with FATAL 25P03 and frees the advance, and
//! `plexsphere_leader::fencing::check` (the extended protocol, in a `Transaction`) answers as on
//! PostgreSQL.
//!
//! A fifth script runs the lease mechanism's statements (`plexsphere_leader::sql::lease`): the
//! setup twice, a claim of a missing row, of another's unexpired row, of its own and of an
//! expired one, renewals by the holder and by another, of an expired lease, a release and a
//! second one, `who_holds` before any claim and after each change, a claim that waits for a
//! fenced transaction's `FOR SHARE` until the block commits, and one whose `lock_timeout` ends
//! that wait with 55P03 and leaves the lease as it was.
//!
//! A fourth script runs the statements of a sharded election (`plexsphere_leader::shard_sql`):
//! two registrations (the shared member lock, the member count, the lock table's size, the
//! bound and the name they set), takes that race for a shard, locks outside the protocol (a
//! shard without the member lock, an `objid` at the count, a negative one, a shard in shared
//! mode), the survey's rows, an unlock of a shard held and one not held (its WARNING), the
//! owners' rows, `pg_advisory_unlock_all` and the empty survey.
#![allow(clippy::unwrap_used)] // tests: an unexpected failure is the assertion
#![allow(missing_docs)] // test functions

use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::poll_fn;
use plexsphere_leader::rank::FloorStep;
use plexsphere_leader_pgsim::{ServerConfig, SimPostgres, connect_with};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::{AsyncMessage, Client, Config, Connection, NoTls, SimpleQueryMessage};

/// A grant without `idle_session_timeout` (the sabotage `skip-idle-session-timeout` of old).
const UNBOUNDED_GRANT: &str = "SELECT CASE WHEN pg_try_advisory_lock(1886156915, 1) \
     THEN 'granted' ELSE 'refused' END, pg_backend_pid()";

/// The election's key in the scripts: the default one.
const KEY: plexsphere_leader::LockKey = plexsphere_leader::LockKey::DEFAULT;
/// The identity the grant statements write into `application_name`.
const IDENTITY: &str = "model-vs-real";

/// The `idle_session_timeout` the script sets, in milliseconds: short, for the real server.
const IDLE_MS: u64 = 300;

fn grant() -> String {
    format!(
        "SELECT CASE WHEN pg_try_advisory_lock(1886156915, 1) THEN \
         set_config('idle_session_timeout', '{IDLE_MS}', false) IS NOT NULL ELSE false END"
    )
}

const UNLOCK: &str = "SELECT pg_advisory_unlock(1886156915, 1)";

/// A client session, with the notices it received and how its connection ended.
struct Session {
    client: Client,
    notices: Arc<Mutex<Vec<String>>>,
    ended: Arc<Mutex<Option<String>>>,
}

impl Session {
    /// Drives `connection` in a task, recording notices and the end (the SQLSTATE of a FATAL,
    /// or "closed").
    fn new<S, T>(client: Client, mut connection: Connection<S, T>) -> Self
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let notices = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(Mutex::new(None));
        let (n, e) = (Arc::clone(&notices), Arc::clone(&ended));
        tokio::spawn(async move {
            loop {
                match poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notice(notice))) => n.lock().unwrap().push(format!(
                        "{} {} {}",
                        notice.severity(),
                        notice.code().code(),
                        notice.message()
                    )),
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        let code = error.as_db_error().map_or_else(
                            || "closed".to_owned(),
                            |db| format!("FATAL {}", db.code().code()),
                        );
                        *e.lock().unwrap() = Some(code);
                        return;
                    }
                    None => {
                        *e.lock().unwrap() = Some("closed".to_owned());
                        return;
                    }
                }
            }
        });
        Self {
            client,
            notices,
            ended,
        }
    }

    /// The one value `query` returns with the notices it raised, or the error's SQLSTATE.
    async fn run(&self, query: &str) -> String {
        self.run_columns(query, false).await
    }

    /// As [`Self::run`], with every column of the row, `|`-separated.
    async fn run_row(&self, query: &str) -> String {
        self.run_columns(query, true).await
    }

    /// The column names of the (last) row `query` returns, `|`-separated.
    async fn names(&self, query: &str) -> String {
        match self.client.simple_query(query).await {
            Ok(messages) => messages
                .iter()
                .rev()
                .find_map(|m| match m {
                    SimpleQueryMessage::Row(row) => Some(
                        row.columns()
                            .iter()
                            .map(|c| c.name().to_owned())
                            .collect::<Vec<_>>()
                            .join("|"),
                    ),
                    _ => None,
                })
                .unwrap_or_else(|| "no row".to_owned()),
            Err(error) => format!("error {error}"),
        }
    }

    async fn run_columns(&self, query: &str, all: bool) -> String {
        let result = self.client.simple_query(query).await;
        // A notice arrives before the reply it belongs to; give the connection task a turn.
        tokio::task::yield_now().await;
        let notices = std::mem::take(&mut *self.notices.lock().unwrap());
        // The last row: a query string of several statements answers with its last one's
        // (a lease claim's settings and transaction lock come first).
        let value = match result {
            Ok(messages) => messages
                .iter()
                .rev()
                .find_map(|m| match m {
                    SimpleQueryMessage::Row(row) if all => Some(
                        (0..row.len())
                            .map(|i| row.get(i).unwrap_or("NULL"))
                            .collect::<Vec<_>>()
                            .join("|"),
                    ),
                    SimpleQueryMessage::Row(row) => Some(row.get(0).unwrap_or("NULL").to_owned()),
                    _ => None,
                })
                .unwrap_or_else(|| "no row".to_owned()),
            Err(error) => match error.as_db_error() {
                Some(db) => format!("error {}", db.code().code()),
                None if error.is_closed() => "error: connection closed".to_owned(),
                None => "error without SQLSTATE".to_owned(),
            },
        };
        if notices.is_empty() {
            value
        } else {
            format!("{value} + {}", notices.join("; "))
        }
    }

    fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap().clone()
    }

    /// Waits up to `limit` for the connection to end; returns how it ended.
    async fn wait_end(&self, limit: Duration) -> String {
        let step = Duration::from_millis(20);
        let mut waited = Duration::ZERO;
        while waited < limit {
            if let Some(end) = self.ended() {
                return end;
            }
            tokio::time::sleep(step).await;
            waited += step;
        }
        "still open".to_owned()
    }

    /// Runs `query` until it returns `want` (another backend may still be exiting), at most
    /// 50 times 20 ms; returns the last answer.
    async fn run_until(&self, query: &str, want: &str) -> String {
        let mut last = String::new();
        for _ in 0..50 {
            last = self.run(query).await;
            if last == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        last
    }
}

/// The scripted sequence; `open` connects a session named after its argument.
async fn script<F, Fut>(open: F) -> Vec<String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Session>,
{
    let mut seen = Vec::new();
    let mut see = |what: &str, observed: String| seen.push(format!("{what}: {observed}"));
    let a = open("a").await;
    let b = open("b").await;
    let c = open("c").await;
    see("a grant", a.run(&grant()).await);
    see("b grant while a holds", b.run(&grant()).await);
    see("b unlock, not held", b.run(UNLOCK).await);
    see("a idle timeout", a.run("SHOW idle_session_timeout").await);
    see("b idle timeout", b.run("SHOW idle_session_timeout").await);
    see("a unlock", a.run(UNLOCK).await);
    see("a unlock again", a.run(UNLOCK).await);
    see("b grant after release", b.run(&grant()).await);
    see("a grant while b holds", a.run(&grant()).await);
    // a keeps the timeout its grant set (is_local = false) after the unlock: switch it off.
    see(
        "a switches its idle timeout off",
        a.run("SET idle_session_timeout = 0").await,
    );
    // b now sits idle past its idle_session_timeout: FATAL 57P05, and the lock goes.
    tokio::time::sleep(Duration::from_millis(IDLE_MS * 2)).await;
    see("b ended", b.wait_end(Duration::from_secs(2)).await);
    see("b query after its end", b.run("SELECT 1").await);
    see(
        "a grant after b's timeout",
        a.run_until(&grant(), "t").await,
    );
    let a_pid = a.run("SELECT pg_backend_pid()").await;
    see(
        "c terminates a",
        c.run(&format!("SELECT pg_terminate_backend({a_pid})"))
            .await,
    );
    see("a ended", a.wait_end(Duration::from_secs(2)).await);
    see(
        "c grant after a's termination",
        c.run_until(&grant(), "t").await,
    );
    see("c unlock", c.run(UNLOCK).await);
    see(
        "c terminates no backend",
        c.run("SELECT pg_terminate_backend(2147483000)").await,
    );
    seen
}

/// Which scripted sequence to run.
#[derive(Debug, Clone, Copy)]
enum Script {
    /// The original grant/unlock/timeout/terminate sequence.
    Locks,
    /// The adapter's grant outcomes, check, queued wait and fencing statements.
    Elector,
    /// The fence row's locks: `FOR SHARE` against the epoch advance.
    Fence,
    /// The statements of a sharded election.
    Shards,
    /// The statements of the lease mechanism.
    Lease,
    /// The statements of a lease shard space.
    ShardLease,
    /// The surveys of ranked replicas.
    Candidacy,
}

async fn run_script<F, Fut>(which: Script, open: F) -> Vec<String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Session>,
{
    match which {
        Script::Locks => script(open).await,
        Script::Elector => elector_script(open).await,
        Script::Fence => fence_script(open).await,
        Script::Shards => shards_script(open).await,
        Script::Lease => lease_script(open).await,
        Script::ShardLease => shard_lease_script(open).await,
        Script::Candidacy => candidacy_script(open).await,
    }
}

/// `observed` with every `|`-separated field of ten digits (a unix time in seconds: the check
/// marker and the server's clock) shown as `<secs>`.
fn unix_seconds_masked(observed: &str) -> String {
    observed
        .split('|')
        .map(|field| {
            if field.len() == 10 && field.bytes().all(|b| b.is_ascii_digit()) {
                "<secs>"
            } else {
                field
            }
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// The idle bound the elector script's grants set, in ms: longer than the script runs.
const BOUND_MS: u32 = 60_000;

/// The elector's statements, from `plexsphere_leader::sql`. A session's own pid shows as
/// `<pid>`.
async fn elector_script<F, Fut>(open: F) -> Vec<String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Session>,
{
    use plexsphere_leader::sql;

    let mut seen = Vec::new();
    let a = open("a").await;
    let b = open("b").await;
    let c = open("c").await;
    let mut pids = Vec::new();
    for s in [&a, &b, &c] {
        pids.push(s.run("SELECT pg_backend_pid()").await);
    }
    let database = a.run("SELECT current_database()").await;
    let own = |observed: String, who: usize| {
        unix_seconds_masked(
            &observed
                .replace(&pids[who], "<pid>")
                .replace(&database, "<db>"),
        )
    };
    let mut see = |what: &str, observed: String| seen.push(format!("{what}: {observed}"));
    see(
        "a try_lock",
        own(a.run_row(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await, 0),
    );
    see(
        "b try_lock",
        own(b.run_row(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await, 1),
    );
    // The grant names the lock session with the server's clock; the refusal leaves b's name.
    let since = |name: String| match name.split_once(" since ") {
        Some((identity, seconds)) if seconds.bytes().all(|b| b.is_ascii_digit()) => {
            format!("{identity} since <{} digits>", seconds.len())
        }
        _ => name,
    };
    see(
        "a's application_name after its grant",
        since(a.run("SELECT current_setting('application_name')").await),
    );
    see(
        "b's application_name after its refusal",
        b.run("SELECT current_setting('application_name')").await,
    );
    see(
        "a try_lock again",
        own(a.run_row(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await, 0),
    );
    see(
        "grant columns",
        b.names(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await,
    );
    see("unbounded columns", b.names(UNBOUNDED_GRANT).await);
    see("verify columns", a.names(&sql::verify(KEY)).await);
    see("a verify", own(a.run_row(&sql::verify(KEY)).await, 0));
    see("b verify", own(b.run_row(&sql::verify(KEY)).await, 1));
    see(
        "a's idle timeouts",
        a.run_row("SELECT current_setting('idle_session_timeout'), current_setting('idle_in_transaction_session_timeout')").await,
    );
    see(
        "b wait_for_lock times out",
        own(
            b.run_row(&sql::wait_for_lock(KEY, IDENTITY, 200, BOUND_MS))
                .await,
            1,
        ),
    );
    see("b lock_timeout after", b.run("SHOW lock_timeout").await);
    see(
        "b idle timeout after",
        b.run("SHOW idle_session_timeout").await,
    );
    // The check takes one more hold of the lock each time (a re-entrant try); the release gives
    // every hold back, so the lock is free after it, whatever the count.
    see("a verify again", own(a.run_row(&sql::verify(KEY)).await, 0));
    see("a unlock", a.run(&sql::unlock(KEY)).await);
    see(
        "c try_lock",
        own(c.run_row(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await, 2),
    );
    // b queues behind c; c's client goes away; the lock goes to b.
    let (b_pid, b_database) = (pids[1].clone(), database.clone());
    let waiting = tokio::spawn(async move {
        let answer = b
            .run_row(&sql::wait_for_lock(KEY, IDENTITY, 10_000, BOUND_MS))
            .await;
        (
            b,
            unix_seconds_masked(&answer.replace(&b_pid, "<pid>").replace(&b_database, "<db>")),
        )
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    see(
        "b answered before c left",
        waiting.is_finished().to_string(),
    );
    drop(c);
    let (b, answer) = waiting.await.unwrap();
    see("b wait_for_lock after c disconnects", answer);
    see("b verify", own(b.run_row(&sql::verify(KEY)).await, 1));
    see("a check before setup", a.run(&sql::fence_check(KEY)).await);
    see(
        "a advance before setup",
        a.run(&sql::advance_epoch(KEY)).await,
    );
    see("a setup", a.run(sql::FENCE_SETUP).await);
    see("a setup again", a.run(sql::FENCE_SETUP).await);
    see("a check after setup", a.run(&sql::fence_check(KEY)).await);
    for n in 1..=3 {
        see(
            &format!("b advance {n}"),
            b.run(&sql::advance_epoch(KEY)).await,
        );
    }
    see("a check", a.run(&sql::fence_check(KEY)).await);
    see("a advance columns", a.names(&sql::advance_epoch(KEY)).await);
    see("b unlock", b.run(&sql::unlock(KEY)).await);
    // The unlock clears the session's mark, so a pooler without a reset query hands it on
    // unmarked: the next grant on it takes the lock instead of finding it shared.
    let mark = "SELECT current_setting('plexsphere.leader_session', true)";
    see("b's mark after its unlock", b.run(mark).await);
    see(
        "b try_lock after its unlock",
        own(b.run_row(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await, 1),
    );
    for n in 1..=2 {
        see(
            &format!("b verify {n}"),
            own(b.run_row(&sql::verify(KEY)).await, 1),
        );
    }
    // A marked session (a vanished leader's, three holds) is cleared whole.
    see(
        "b release_if_held marked",
        b.run(&sql::release_if_held(KEY)).await,
    );
    see("b's mark after the release", b.run(mark).await);
    see(
        "a try_lock after b's release",
        own(a.run_row(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await, 0),
    );
    // Unmarked: another session holds the lock (a standby's steady state), then it is free.
    see(
        "b release_if_held held by a",
        b.run(&sql::release_if_held(KEY)).await,
    );
    see("a unlock again", a.run(&sql::unlock(KEY)).await);
    see(
        "b release_if_held free",
        b.run(&sql::release_if_held(KEY)).await,
    );
    // Unmarked and held by this session (a queued grant at the instant of its lock_timeout).
    see(
        "b takes the lock unmarked",
        b.run("SELECT pg_try_advisory_lock(1886156915, 1)").await,
    );
    see(
        "b release_if_held own",
        b.run(&sql::release_if_held(KEY)).await,
    );
    see(
        "a try_lock after b's own release",
        own(a.run_row(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await, 0),
    );
    see("a unlock at the end", a.run(&sql::unlock(KEY)).await);
    seen
}

/// The fence row's locks, with the statements of `plexsphere_leader::sql` and
/// `plexsphere_leader::fencing::check`.
async fn fence_script<F, Fut>(open: F) -> Vec<String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Session>,
{
    use plexsphere_leader::{fencing, sql};

    let mut seen = Vec::new();
    let mut see = |what: &str, observed: String| seen.push(format!("{what}: {observed}"));
    let a = open("a").await;
    let b = open("b").await;
    let mut c = open("c").await;
    see("a setup", a.run(sql::FENCE_SETUP).await);
    see("a advance", a.run(&sql::advance_epoch(KEY)).await);
    see("a begin", a.run("BEGIN").await);
    see("a check in its block", a.run(&sql::fence_check(KEY)).await);
    let waiting = tokio::spawn(async move {
        let answer = b.run(&sql::advance_epoch(KEY)).await;
        (b, answer)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    see(
        "b's advance answered while a's block is open",
        waiting.is_finished().to_string(),
    );
    see("c begin", c.run("BEGIN").await);
    see("c check while b waits", c.run(&sql::fence_check(KEY)).await);
    see("a commit", a.run("COMMIT").await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    see(
        "b's advance answered while c's block is open",
        waiting.is_finished().to_string(),
    );
    see("c commit", c.run("COMMIT").await);
    let (b, answer) = waiting.await.unwrap();
    see("b's advance once both blocks ended", answer);
    see("a begin again", a.run("BEGIN").await);
    see("a check again", a.run(&sql::fence_check(KEY)).await);
    see("b lock_timeout", b.run("SET lock_timeout = '200ms'").await);
    see(
        "b advance under lock_timeout",
        b.run(&sql::advance_epoch(KEY)).await,
    );
    see("a rollback", a.run("ROLLBACK").await);
    see(
        "a check outside a block",
        a.run(&sql::fence_check(KEY)).await,
    );
    see("b advance after it", b.run(&sql::advance_epoch(KEY)).await);
    // The driver's advance commits durably on a session whose own setting is off, and leaves
    // that setting as it was.
    see(
        "b synchronous_commit off",
        b.run("SET synchronous_commit = off").await,
    );
    see(
        "b advance as the driver sends it",
        b.run(&sql::advance_epoch_within(KEY, 200)).await,
    );
    see(
        "b synchronous_commit after it",
        b.run("SHOW synchronous_commit").await,
    );
    see(
        "b synchronous_commit refused",
        b.run("SET synchronous_commit = sometimes").await,
    );
    see(
        "b synchronous_commit reset",
        b.run("RESET synchronous_commit").await,
    );
    see("b lock_timeout off", b.run("SET lock_timeout = 0").await);
    see(
        "b SET LOCAL outside a block",
        b.run("SET LOCAL lock_timeout = '1s'").await,
    );
    see("b lock_timeout after it", b.run("SHOW lock_timeout").await);
    see(
        "a bounded block",
        a.run("BEGIN; SET LOCAL idle_in_transaction_session_timeout = '300ms'")
            .await,
    );
    see(
        "a check in the bounded block",
        a.run(&sql::fence_check(KEY)).await,
    );
    let waiting = tokio::spawn(async move { b.run(&sql::advance_epoch(KEY)).await });
    see("a ended", a.wait_end(Duration::from_secs(2)).await);
    see(
        "b's advance after a's idle-in-transaction timeout",
        waiting.await.unwrap(),
    );
    let transaction = c.client.transaction().await.unwrap();
    let outcome = |result: Result<(), fencing::FenceError>| match result {
        Ok(()) => "ok".to_owned(),
        Err(error) => error.to_string(),
    };
    see(
        "c fencing::check of the current epoch",
        outcome(fencing::check(&transaction, KEY, 5).await),
    );
    see(
        "c fencing::check of an older epoch",
        outcome(fencing::check(&transaction, KEY, 4).await),
    );
    transaction.rollback().await.unwrap();
    seen
}

/// The lease's TTL in the lease script, in milliseconds, and how long the script sleeps for a
/// lease to expire.
const LEASE_TTL_MS: u32 = 300;
const PAST_THE_TTL: Duration = Duration::from_millis(500);

/// `observed` with every `|`-separated field that reads as a unix time (the lease's expiry as
/// `date_part('epoch', …)`, seconds with a fraction) shown as `<unix>`.
fn unix_time_masked(observed: &str) -> String {
    observed
        .split('|')
        .map(|field| match field.parse::<f64>() {
            Ok(seconds) if seconds > 1e9 => "<unix>",
            _ => field,
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// The lease mechanism's statements, with `plexsphere_leader::sql::lease` and
/// `plexsphere_leader::sql::fence_check`.
async fn lease_script<F, Fut>(open: F) -> Vec<String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Session>,
{
    use plexsphere_leader::sql::{self, lease};

    let mut seen = Vec::new();
    let mut see = |what: &str, observed: String| seen.push(format!("{what}: {observed}"));
    let a = open("a").await;
    let b = open("b").await;
    let c = open("c").await;
    let claim = |holder: &str| {
        lease::claim(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            KEY,
            holder,
            LEASE_TTL_MS,
            1_000,
        )
    };
    let renew = |holder: &str| {
        lease::renew(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            KEY,
            holder,
            LEASE_TTL_MS,
        )
    };
    let who = || lease::who_holds(plexsphere_leader::sql::lease::DEFAULT_SCHEMA, KEY);
    see(
        "a setup",
        a.run(&lease::setup(plexsphere_leader::sql::lease::DEFAULT_SCHEMA))
            .await,
    );
    see(
        "a setup again",
        a.run(&lease::setup(plexsphere_leader::sql::lease::DEFAULT_SCHEMA))
            .await,
    );
    see("who holds before a claim", a.run_row(&who()).await);
    see("a claims the missing row", a.run(&claim("A")).await);
    see("b claims a's unexpired lease", b.run(&claim("B")).await);
    see("a claims its own lease", a.run(&claim("A")).await);
    see("b renews a's lease", b.run(&renew("B")).await);
    see("a renews its lease", a.run(&renew("A")).await);
    see("who holds", unix_time_masked(&c.run_row(&who()).await));
    see("who holds columns", c.names(&who()).await);
    // The column names come from running the claim: a's own again, epoch 3.
    see("claim columns", c.names(&claim("A")).await);
    see(
        "a releases",
        a.run(&lease::release(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            KEY,
            "A",
        ))
        .await,
    );
    see(
        "a releases again",
        a.run(&lease::release(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            KEY,
            "A",
        ))
        .await,
    );
    see(
        "who holds after the release",
        unix_time_masked(&c.run_row(&who()).await),
    );
    see("b claims the released lease", b.run(&claim("B")).await);
    see("a renews b's lease", a.run(&renew("A")).await);
    tokio::time::sleep(PAST_THE_TTL).await;
    see(
        "who holds once expired",
        unix_time_masked(&c.run_row(&who()).await),
    );
    // A renewal never revives an expired lease (one arriving after a release, or too late).
    see("b renews its expired lease", b.run(&renew("B")).await);
    see(
        "who holds after it",
        unix_time_masked(&c.run_row(&who()).await),
    );
    tokio::time::sleep(PAST_THE_TTL).await;
    see("a claims b's expired lease", a.run(&claim("A")).await);
    // A fenced transaction of b holds the fence row: a's claim of its own lease waits.
    see("b begin", b.run("BEGIN").await);
    see("b fence check", b.run(&sql::fence_check(KEY)).await);
    let waiting = tokio::spawn(async move {
        let answer = a.run(&claim("A")).await;
        (a, answer)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    see(
        "a's claim answered while b's block is open",
        waiting.is_finished().to_string(),
    );
    see("b commit", b.run("COMMIT").await);
    let (a, answer) = waiting.await.unwrap();
    see("a's claim once b's block ended", answer);
    // The claim's lock_timeout ends its wait with 55P03, and the lease stays as it was.
    tokio::time::sleep(PAST_THE_TTL).await;
    see("b begin again", b.run("BEGIN").await);
    see("b fence check again", b.run(&sql::fence_check(KEY)).await);
    see(
        "c claims a's expired lease under a lock_timeout",
        c.run(&lease::claim(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            KEY,
            "C",
            LEASE_TTL_MS,
            200,
        ))
        .await,
    );
    see("b rollback", b.run("ROLLBACK").await);
    see(
        "who holds after the timeout",
        unix_time_masked(&a.run_row(&who()).await),
    );
    see(
        "c's lock_timeout after it",
        c.run("SHOW lock_timeout").await,
    );
    seen
}

/// `observed` with every run of 13 digits (the server's unix milliseconds) shown as `<ms>`, and
/// its `; `-separated rows sorted (the real server lists `pg_stat_activity` in the order of its
/// backend slots and a table in its heap's, neither of which the model follows).
fn millis_masked(observed: &str) -> String {
    let mut masked = String::new();
    let mut digits = String::new();
    for c in observed.chars().chain(['\n']) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if digits.len() == 13 {
            masked.push_str("<ms>");
        } else {
            masked.push_str(&digits);
        }
        digits.clear();
        masked.push(c);
    }
    masked.pop();
    let mut rows: Vec<&str> = masked.split("; ").collect();
    rows.sort_unstable();
    rows.join("; ")
}

/// The surveys of ranked replicas (`plexsphere_leader::sql::candidacy`): over the sessions,
/// the standbys' that publish their candidacy in `application_name` and the leader's that only
/// reads, before and after a session ends; over the lease's unlogged table, before its setup,
/// the standbys' upserts and the leader's read; each answer's columns.
async fn candidacy_script<F, Fut>(open: F) -> Vec<String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Session>,
{
    use plexsphere_leader::rank::{Candidate, FloorStep, Rank, Version};
    use plexsphere_leader::sql::{candidacy, lease};

    let mut seen = Vec::new();
    let mut see = |what: &str, observed: String| seen.push(format!("{what}: {observed}"));
    let a = open("a").await;
    let b = open("b").await;
    let c = open("c").await;
    let rank = |version: &str, live_ms: u64| Candidate {
        rank: Rank {
            priority: 1,
            version: Version::parse(version).unwrap(),
        },
        live_for: Duration::from_millis(live_ms),
    };
    let standby = |version: &str, live_ms: u64, identity: &'static str| {
        candidacy::survey_sessions(
            KEY,
            Some((rank(version, live_ms), identity)),
            (candidacy::FLOOR_TABLE, FloorStep::Off),
        )
    };
    let leader = candidacy::survey_sessions(KEY, None, (candidacy::FLOOR_TABLE, FloorStep::Off));
    see(
        "a surveys alone",
        millis_masked(&all_rows(&a, &standby("1.0.0", 0, "A")).await),
    );
    see(
        "a's application_name",
        millis_masked(&a.run("SHOW application_name").await),
    );
    see(
        "b surveys",
        millis_masked(&all_rows(&b, &standby("2.0.0-rc.1", 150, "B")).await),
    );
    see("survey columns", c.names(&leader).await);
    see(
        "c surveys as leader",
        millis_masked(&all_rows(&c, &leader).await),
    );
    see(
        "c's application_name after it",
        c.run("SHOW application_name").await,
    );
    drop(b);
    let mut after = String::new();
    for _ in 0..50 {
        after = millis_masked(&all_rows(&c, &leader).await);
        if !after.contains(" B") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    see("c surveys once b ended", after);
    let schema = lease::DEFAULT_SCHEMA;
    let table = candidacy::candidate_table(schema);
    let rows = |holder: &str, mine: Option<Candidate>| {
        candidacy::survey_rows(
            &table,
            KEY,
            holder,
            mine,
            (candidacy::FLOOR_TABLE, FloorStep::Off),
        )
    };
    see(
        "a surveys rows before the setup",
        all_rows(&a, &rows("A", Some(rank("1.0.0", 0)))).await,
    );
    see("a setup", a.run(&lease::setup(schema)).await);
    see(
        "a surveys rows alone",
        millis_masked(&all_rows(&a, &rows("A", Some(rank("1.0.0", 0)))).await),
    );
    see(
        "c surveys rows as B",
        millis_masked(&all_rows(&c, &rows("B", Some(rank("2.0.0", 40)))).await),
    );
    see(
        "a surveys rows again",
        millis_masked(&all_rows(&a, &rows("A", Some(rank("1.0.0", 100)))).await),
    );
    see(
        "c surveys rows as leader C",
        millis_masked(&all_rows(&c, &rows("C", None)).await),
    );
    see("rows columns", c.names(&rows("C", None)).await);
    seen
}

/// The statements of a lease shard space (`plexsphere_leader::shard_sql::lease`) on space
/// [`CLASS`] of four shards, with a TTL of [`LEASE_TTL_MS`]: the setup twice, registrations,
/// takes of free and owned shards, the survey, renewals by the wrong holder and the right one,
/// a release, a leave (twice), an expired member reaped by another's take and a late renewal
/// of it, each answer's columns.
async fn shard_lease_script<F, Fut>(open: F) -> Vec<String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Session>,
{
    use plexsphere_leader::shard_sql::lease;
    use plexsphere_leader::sharded::{MemberId, Shard};

    const SCHEMA: &str = plexsphere_leader::sql::lease::DEFAULT_SCHEMA;
    let shards = |list: &[u32]| list.iter().copied().map(Shard::new).collect::<Vec<_>>();
    let take = |member: i32, list: &[u32]| {
        lease::take(SCHEMA, CLASS, MemberId::new(member), &shards(list), 1_000)
    };
    let renew = |member: i32, holder: &str| {
        lease::renew(SCHEMA, CLASS, MemberId::new(member), holder, LEASE_TTL_MS)
    };
    let register =
        |holder: &str| lease::register(SCHEMA, CLASS, holder, LEASE_TTL_MS, FloorStep::Off);
    let survey = || lease::survey(SCHEMA, CLASS, 4, FloorStep::Off);
    let mut seen = Vec::new();
    let mut see = |what: &str, observed: String| seen.push(format!("{what}: {observed}"));
    let a = open("a").await;
    let b = open("b").await;
    see("a setup", a.run(&lease::setup(SCHEMA)).await);
    see("a setup again", a.run(&lease::setup(SCHEMA)).await);
    see("a registers", a.run_row(&register("A")).await);
    see("b registers", b.run_row(&register("B")).await);
    see("register columns", b.names(&register("C")).await);
    see("a takes 0, 1", a.run_row(&take(1, &[0, 1])).await);
    see("b takes 1, 2, 3", b.run_row(&take(2, &[1, 2, 3])).await);
    see("take columns", b.names(&take(2, &[])).await);
    see("a survey", all_rows(&a, &survey()).await);
    see("survey columns", a.names(&survey()).await);
    see("a renews as B", a.run_row(&renew(1, "B")).await);
    see("a renews", a.run_row(&renew(1, "A")).await);
    see("renew columns", a.names(&renew(1, "A")).await);
    let release = lease::release(SCHEMA, CLASS, MemberId::new(2), &shards(&[1, 3]));
    see("b releases 1, 3", all_rows(&b, &release).await);
    see("release columns", b.names(&release).await);
    let leave = lease::leave(SCHEMA, CLASS, MemberId::new(2));
    see("b leaves", all_rows(&b, &leave).await);
    see("b leaves again", all_rows(&b, &leave).await);
    see(
        "the member C never used leaves",
        a.names(&lease::leave(SCHEMA, CLASS, MemberId::new(3)))
            .await,
    );
    see("a survey after the leave", all_rows(&a, &survey()).await);
    tokio::time::sleep(PAST_THE_TTL).await;
    see("b registers again", b.run_row(&register("B2")).await);
    see(
        "b takes 0, 2 after a expired",
        b.run_row(&take(4, &[0, 2])).await,
    );
    see("a renews after the reap", a.run_row(&renew(1, "A")).await);
    see("a takes 3 after the reap", a.run_row(&take(1, &[3])).await);
    see("b survey", all_rows(&b, &survey()).await);
    seen
}

/// The shard space of the sharded script: a negative class, shown as an `oid` in `pg_locks`.
const CLASS: i32 = -7;
/// Its number of shards.
const COUNT: u32 = 8;

/// Every row of `query`, `|`-separated columns (`NULL` for NULL), rows in the order the server
/// sent them joined by `; `, then the notices it raised; or the error's SQLSTATE.
async fn all_rows(session: &Session, query: &str) -> String {
    let result = session.client.simple_query(query).await;
    tokio::task::yield_now().await;
    let notices = std::mem::take(&mut *session.notices.lock().unwrap());
    let rows = match result {
        Ok(messages) => {
            let rows: Vec<String> = messages
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(row) => Some(
                        (0..row.len())
                            .map(|i| row.get(i).unwrap_or("NULL"))
                            .collect::<Vec<_>>()
                            .join("|"),
                    ),
                    _ => None,
                })
                .collect();
            if rows.is_empty() {
                "no row".to_owned()
            } else {
                rows.join("; ")
            }
        }
        Err(error) => match error.as_db_error() {
            Some(db) => format!("error {}", db.code().code()),
            None => "error without SQLSTATE".to_owned(),
        },
    };
    if notices.is_empty() {
        rows
    } else {
        format!("{rows} + {}", notices.join("; "))
    }
}

/// The statements of `plexsphere_leader::shard_sql`. Backend pids show as the sessions'
/// names (`<a>`); rows that the statements order by pid are checked to be ascending and then
/// shown in the order of the sessions' names, since the real server's pids need not rise with
/// the order the sessions were opened in.
async fn shards_script<F, Fut>(open: F) -> Vec<String>
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = Session>,
{
    use plexsphere_leader::shard_sql;
    use plexsphere_leader::sharded::Shard;

    let shards = |numbers: &[u32]| numbers.iter().copied().map(Shard::new).collect::<Vec<_>>();
    let mut seen = Vec::new();
    let a = open("a").await;
    let b = open("b").await;
    let c = open("c").await;
    let mut pids = Vec::new();
    for s in [&a, &b, &c] {
        pids.push(s.run("SELECT pg_backend_pid()").await);
    }
    let names = ["<a>", "<b>", "<c>"];
    // The lock table's slots, computed here: the model's general parser has no arithmetic.
    let mut setting = Vec::new();
    for name in [
        "max_locks_per_transaction",
        "max_connections",
        "max_prepared_transactions",
    ] {
        let value = a.run(&format!("SELECT current_setting('{name}')")).await;
        setting.push(value.parse::<u64>().unwrap());
    }
    let settings = (setting[0] * (setting[1] + setting[2])).to_string();
    // Pids masked; rows by pid checked ascending, then sorted by the names.
    let mask = |observed: String| {
        let (rows, notices) = match observed.split_once(" + ") {
            Some((rows, notices)) => (rows.to_owned(), format!(" + {notices}")),
            None => (observed.clone(), String::new()),
        };
        let rows: Vec<&str> = rows.split("; ").collect();
        let first = |row: &str| {
            row.split('|')
                .next()
                .unwrap_or_default()
                .parse::<i64>()
                .ok()
        };
        let firsts: Vec<Option<i64>> = rows.iter().map(|row| first(row)).collect();
        let ascending = firsts.windows(2).all(|w| w[0] <= w[1]);
        let mut masked: Vec<String> = rows
            .iter()
            .map(|row| {
                row.split('|')
                    .map(|field| {
                        pids.iter().position(|pid| pid == field).map_or_else(
                            || field.replace(&settings, "<capacity>"),
                            |i| names[i].to_owned(),
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect();
        masked.sort();
        let order = if ascending {
            ""
        } else {
            " (NOT ascending by pid)"
        };
        format!("{}{order}{notices}", masked.join("; "))
    };
    let mut see = |what: &str, observed: String| seen.push(format!("{what}: {observed}"));
    let register = |name: &str| shard_sql::register(CLASS, name, 60_000);
    see("a register", mask(all_rows(&a, &register("alpha")).await));
    see("b register", mask(all_rows(&b, &register("beta")).await));
    see("register columns", b.names(&register("beta")).await);
    see(
        "b bound and name",
        b.run_row(
            "SELECT current_setting('idle_session_timeout'), \
             current_setting('idle_in_transaction_session_timeout'), \
             current_setting('application_name')",
        )
        .await,
    );
    let take = |asked: &[u32]| shard_sql::take(CLASS, &shards(asked));
    see("a take 0,1,2", mask(all_rows(&a, &take(&[0, 1, 2])).await));
    see("b take 2,3", mask(all_rows(&b, &take(&[2, 3])).await));
    see("b take none", mask(all_rows(&b, &take(&[])).await));
    for outside in [
        "SELECT pg_try_advisory_lock(-7, 6)",
        "SELECT pg_try_advisory_lock(-7, 8)",
        "SELECT pg_try_advisory_lock(-7, -2)",
        "SELECT pg_try_advisory_lock_shared(-7, 5)",
        "SELECT pg_try_advisory_lock(7, 4)",
    ] {
        see(&format!("c {outside}"), c.run(outside).await);
    }
    let survey = shard_sql::survey(CLASS, COUNT, FloorStep::Off);
    see("a survey", mask(all_rows(&a, &survey).await));
    see("survey columns", a.names(&survey).await);
    see(
        "a unlock 1,3",
        mask(all_rows(&a, &shard_sql::unlock(CLASS, &shards(&[1, 3]))).await),
    );
    see("b survey", mask(all_rows(&b, &survey).await));
    let owners = shard_sql::owners(CLASS, COUNT);
    see("c owners", mask(all_rows(&c, &owners).await));
    see("owners columns", c.names(&owners).await);
    see(
        "c owners of the positive twin",
        mask(all_rows(&c, &shard_sql::owners(7, COUNT)).await),
    );
    for (name, s) in [("a", &a), ("b", &b), ("c", &c)] {
        see(
            &format!("{name} unlock_all"),
            all_rows(s, &shard_sql::unlock_all()).await,
        );
    }
    see(
        "a survey of the empty space",
        mask(all_rows(&a, &survey).await),
    );
    see(
        "a owners of the empty space",
        mask(all_rows(&a, &owners).await),
    );
    seen
}

fn observed_on_the_model(which: Script) -> Vec<String> {
    let mut sim = turmoil::Builder::new()
        .rng_seed(1)
        .simulation_duration(Duration::from_secs(60))
        .build();
    let (server, _handle) = SimPostgres::new(ServerConfig::default());
    sim.host("pg", move || server.clone().serve(5432));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&seen);
    sim.client("app", async move {
        let open = |name: &'static str| async move {
            let mut config = Config::new();
            config
                .user("app")
                .dbname("plx_sim_model")
                .application_name(name);
            let (client, connection) = connect_with("pg", 5432, &config).await.unwrap();
            Session::new(client, connection)
        };
        *out.lock().unwrap() = run_script(which, open).await;
        Ok(())
    });
    sim.run().unwrap();
    seen.lock().unwrap().clone()
}

fn real_config() -> Config {
    let dsn = std::env::var("PLEXSPHERE_TEST_DSN")
        .ok()
        .filter(|dsn| !dsn.trim().is_empty())
        .unwrap_or_else(|| "host=127.0.0.1 port=5432 user=postgres dbname=postgres".to_owned());
    Config::from_str(&dsn).unwrap()
}

async fn observed_on_postgres(which: Script) -> Vec<String> {
    let admin_config = real_config();
    let (admin, connection) = admin_config.connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    let database = format!(
        "plx_sim_model_{}_{}",
        format!("{which:?}").to_lowercase(),
        std::process::id()
    );
    admin
        .simple_query(&format!("DROP DATABASE IF EXISTS {database}"))
        .await
        .unwrap();
    admin
        .simple_query(&format!("CREATE DATABASE {database}"))
        .await
        .unwrap();
    let open = |name: &'static str| {
        let mut config = real_config();
        config.dbname(&database).application_name(name);
        async move {
            let (client, connection) = config.connect(NoTls).await.unwrap();
            Session::new(client, connection)
        }
    };
    let seen = run_script(which, open).await;
    admin
        .simple_query(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await
        .unwrap();
    seen
}

#[test]
fn the_simulated_server_answers_the_adapters_statements_as_postgresql_does() {
    let model = agreed(Script::Locks);
    assert!(
        model.iter().any(|line| line == "b ended: FATAL 57P05"),
        "{model:?}"
    );
    assert!(
        model.iter().any(|line| line == "a ended: FATAL 57P01"),
        "{model:?}"
    );
}

/// What the client saw of `which` on the model, asserted equal, line by line, to what it
/// saw on the real server.
fn agreed(which: Script) -> Vec<String> {
    let (model, real) = compare(which);
    assert_eq!(
        model,
        real,
        "\nmodel:\n  {}\nreal:\n  {}",
        model.join("\n  "),
        real.join("\n  ")
    );
    model
}

/// The same script on the model and on the real server.
fn compare(which: Script) -> (Vec<String>, Vec<String>) {
    let model = observed_on_the_model(which);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let real = runtime.block_on(observed_on_postgres(which));
    (model, real)
}

#[test]
fn the_simulated_server_answers_the_electors_grant_check_wait_and_fence_statements_as_postgresql_does()
 {
    let model = agreed(Script::Elector);
    for line in [
        "grant columns: set_config|pg_backend_pid|current_database|current_setting|concat",
        "unbounded columns: case|pg_backend_pid",
        "verify columns: pg_backend_pid|pg_is_in_recovery|pg_try_advisory_lock|current_setting|set_config",
        "a verify again: <pid>|f|t|shared|<secs>",
        "b verify: <pid>|f|f|NULL|<secs>",
        "a try_lock: granted|<pid>|<db>|<secs>|<secs>",
        "b try_lock: refused|<pid>|<db>|NULL|<secs>",
        "a's application_name after its grant: model-vs-real since <10 digits>",
        "b's application_name after its refusal: b",
        "a try_lock again: shared|<pid>|<db>|<secs>|<secs>",
        "b wait_for_lock times out: error 55P03",
        "b wait_for_lock after c disconnects: granted|<pid>|<db>|<secs>|<secs>",
        "a check: 3",
        "b's mark after its unlock: ",
        "b try_lock after its unlock: granted|<pid>|<db>|<secs>|<secs>",
        "b release_if_held marked: t",
        "b's mark after the release: ",
        "a try_lock after b's release: granted|<pid>|<db>|<secs>|<secs>",
        "b release_if_held held by a: f",
        "b release_if_held free: f",
        "b takes the lock unmarked: t",
        "b release_if_held own: t",
        "a try_lock after b's own release: granted|<pid>|<db>|<secs>|<secs>",
    ] {
        assert!(model.iter().any(|l| l == line), "{line}: {model:?}");
    }
}

#[test]
fn the_simulated_server_locks_the_fence_row_as_postgresql_does() {
    let model = agreed(Script::Fence);
    for line in [
        "b's advance answered while a's block is open: false",
        "c check while b waits: 1",
        "b's advance answered while c's block is open: false",
        "b's advance once both blocks ended: 2",
        "b advance under lock_timeout: error 55P03",
        "b advance after it: 3",
        "b advance as the driver sends it: 4",
        "b synchronous_commit after it: off",
        "b synchronous_commit refused: error 22023",
        "a ended: FATAL 25P03",
        "b's advance after a's idle-in-transaction timeout: 5",
        "c fencing::check of the current epoch: ok",
    ] {
        assert!(model.iter().any(|l| l == line), "{line}: {model:?}");
    }
}

#[test]
fn the_simulated_server_answers_the_shard_statements_as_postgresql_does() {
    let model = agreed(Script::Shards);
    for line in [
        "a register: <a>|t|<capacity>|0|f",
        "b register: <b>|t|<capacity>|1|f",
        "a take 0,1,2: 0; 1; 2",
        "b take 2,3: 3",
        "a survey: <a>|t|0,1,2|alpha|<a>; <b>|t|3|beta|<a>; <c>|f|6|c|<a>",
        "a unlock 1,3: 3 + WARNING 01000 you don't own a lock of type ExclusiveLock",
        "a survey of the empty space: NULL|NULL|NULL|NULL|<a>",
    ] {
        assert!(model.iter().any(|l| l == line), "{line}: {model:?}");
    }
}

#[test]
fn the_simulated_server_answers_the_lease_statements_as_postgresql_does() {
    let model = agreed(Script::Lease);
    for line in [
        "who holds before a claim: no row",
        "a claims the missing row: 1",
        "b claims a's unexpired lease: NULL",
        "a claims its own lease: 2",
        "b renews a's lease: no row",
        "who holds: A|2|<unix>|t",
        "who holds columns: holder|epoch|date_part|?column?",
        "claim columns: epoch|schemas",
        "who holds after the release: A|3|<unix>|f",
        "b claims the released lease: 4",
        "b renews its expired lease: no row",
        "a claims b's expired lease: 5",
        "a's claim answered while b's block is open: false",
        "a's claim once b's block ended: 6",
        "c claims a's expired lease under a lock_timeout: error 55P03",
        "who holds after the timeout: A|6|<unix>|f",
    ] {
        assert!(model.iter().any(|l| l == line), "{line}: {model:?}");
    }
}

#[test]
fn the_simulated_server_answers_the_lease_shard_statements_as_postgresql_does() {
    let model = agreed(Script::ShardLease);
    for line in [
        "a registers: 1|0",
        "b registers: 2|1",
        "a takes 0, 1: 1|0:1,1:1",
        "b takes 1, 2, 3: 1|2:1,3:1",
        "a survey: 1|A|0,1; 2|B|2,3; 3|C|NULL",
        "a renews as B: 0|1,2,3",
        "b takes 0, 2 after a expired: 1|0:2,2:2",
        "a renews after the reap: 0|4",
    ] {
        assert!(model.iter().any(|l| l == line), "{line}: {model:?}");
    }
}

#[test]
fn the_simulated_server_answers_the_candidacy_surveys_as_postgresql_does() {
    let model = agreed(Script::Candidacy);
    for line in [
        "a surveys alone: no row",
        "a's application_name: ~706c7873.1 1 1.0.0 <ms> 0 A",
        "b surveys: ~706c7873.1 1 1.0.0 <ms> 0 A|<ms>",
        "survey columns: application_name|int8",
        "c surveys as leader: ~706c7873.1 1 1.0.0 <ms> 0 A|<ms>; ~706c7873.1 1 2.0.0-rc.1 <ms> 150 B|<ms>",
        "c's application_name after it: c",
        "c surveys once b ended: ~706c7873.1 1 1.0.0 <ms> 0 A|<ms>",
        "a surveys rows before the setup: error 42P01",
        "a surveys rows alone: no row",
        "c surveys rows as B: ~706c7873.1 1 1.0.0 <ms> 0 A|<ms>",
        "a surveys rows again: ~706c7873.1 1 2.0.0 <ms> 40 B|<ms>",
        "c surveys rows as leader C: ~706c7873.1 1 1.0.0 <ms> 100 A|<ms>; ~706c7873.1 1 2.0.0 <ms> 40 B|<ms>",
        "rows columns: concat|int8",
    ] {
        assert!(model.iter().any(|l| l == line), "{line}: {model:?}");
    }
}
