//! The simulated PostgreSQL server, driven by an unmodified `tokio_postgres` client inside
//! turmoil.
#![allow(clippy::unwrap_used)] // tests: an unexpected failure is the assertion
#![allow(missing_docs)] // test functions

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::poll_fn;
use plexsphere_leader_pgsim::{
    ConnectError, EndReason, Event, LockId, LockKey, LockMode, Primary, ReleaseReason,
    ServerConfig, ServerHandle, SimPostgres, TransactionStatus, connect_with,
};
use tokio::task::JoinHandle;
use tokio::time::sleep;
use tokio_postgres::error::DbError;
use tokio_postgres::{Client, Config, SimpleQueryMessage};
use turmoil::{Builder, Sim};
/// A grant without `idle_session_timeout` (the sabotage `skip-idle-session-timeout` of old).
const UNBOUNDED_GRANT: &str = "SELECT CASE WHEN pg_try_advisory_lock(1886156915, 1) \
     THEN 'granted' ELSE 'refused' END, pg_backend_pid()";

const PORT: u16 = 5432;
const DB: &str = "plexsphere";
const LEADER: LockKey = LockKey::Pair(1_886_156_915, 1);

fn grant(timeout_ms: u64) -> String {
    format!(
        "SELECT CASE WHEN pg_try_advisory_lock(1886156915, 1) THEN \
         set_config('idle_session_timeout', '{timeout_ms}', false) IS NOT NULL ELSE false END"
    )
}

const PING: &str = "SELECT 1";
const UNLOCK: &str = "SELECT pg_advisory_unlock(1886156915, 1)";

/// A simulation with a fixed 1 ms message latency, so that times are exact.
fn sim<'a>() -> Sim<'a> {
    Builder::new()
        .simulation_duration(Duration::from_secs(120))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(1))
        .build()
}

fn server(sim: &mut Sim<'_>, host: &str, config: ServerConfig) -> ServerHandle {
    let (server, handle) = SimPostgres::new(config);
    sim.host(host, move || server.clone().serve(PORT));
    handle
}

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap()
}

/// A client session whose connection task runs on the current host, recording the
/// server's notices and how the connection ended.
struct Session {
    client: Client,
    notices: Rc<RefCell<Vec<DbError>>>,
    ended: Rc<RefCell<Option<Result<(), tokio_postgres::Error>>>>,
    task: JoinHandle<()>,
}

impl Session {
    async fn open(host: &str, name: &str) -> Result<Self, ConnectError> {
        let mut config = Config::new();
        config.user(name).dbname(DB).application_name(name);
        let (client, mut connection) = connect_with(host, PORT, &config).await?;
        let notices = Rc::new(RefCell::new(Vec::new()));
        let ended = Rc::new(RefCell::new(None));
        let (n, e) = (Rc::clone(&notices), Rc::clone(&ended));
        let task = tokio::task::spawn_local(async move {
            loop {
                match poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(tokio_postgres::AsyncMessage::Notice(notice))) => {
                        n.borrow_mut().push(notice);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        *e.borrow_mut() = Some(Err(error));
                        return;
                    }
                    None => {
                        *e.borrow_mut() = Some(Ok(()));
                        return;
                    }
                }
            }
        });
        Ok(Self {
            client,
            notices,
            ended,
            task,
        })
    }

    /// The single value of a one-row query.
    async fn value(&self, query: &str) -> Result<String, tokio_postgres::Error> {
        let messages = self.client.simple_query(query).await?;
        let rows: Vec<String> = messages
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(row.get(0).unwrap_or("NULL").to_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(rows.len(), 1, "{query}");
        Ok(rows[0].clone())
    }

    /// The column names and values (NULL as "NULL") of a query's rows; no row is `None`.
    async fn row(
        &self,
        query: &str,
    ) -> Result<Option<(Vec<String>, Vec<String>)>, tokio_postgres::Error> {
        let messages = self.client.simple_query(query).await?;
        let mut rows = messages.iter().filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some((
                row.columns().iter().map(|c| c.name().to_owned()).collect(),
                (0..row.len())
                    .map(|i| row.get(i).unwrap_or("NULL").to_owned())
                    .collect(),
            )),
            _ => None,
        });
        let first = rows.next();
        assert!(rows.next().is_none(), "{query}: more than one row");
        Ok(first)
    }

    /// The values of a query's single row.
    async fn values(&self, query: &str) -> Result<Vec<String>, tokio_postgres::Error> {
        Ok(self.row(query).await?.expect("one row").1)
    }

    async fn pid(&self) -> i32 {
        self.value("SELECT pg_backend_pid()")
            .await
            .unwrap()
            .parse()
            .unwrap()
    }

    /// The SQLSTATE the connection ended with; `None` while it runs, `Some("")` when it
    /// ended without a server error.
    fn ended_code(&self) -> Option<String> {
        self.ended.borrow().as_ref().map(|r| match r {
            Ok(()) => String::new(),
            Err(e) => code(e),
        })
    }
}

fn code(error: &tokio_postgres::Error) -> String {
    error
        .as_db_error()
        .map(|e| e.code().code().to_owned())
        .unwrap_or_default()
}

fn releases(handle: &ServerHandle) -> Vec<(i32, u64, ReleaseReason)> {
    handle
        .log()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::LockReleased {
                pid,
                remaining,
                reason,
                ..
            } => Some((pid, remaining, reason)),
            _ => None,
        })
        .collect()
}

fn release_time(handle: &ServerHandle, pid: i32) -> Option<Duration> {
    handle.log().into_iter().find_map(|e| match e.event {
        Event::LockReleased {
            pid: p,
            remaining: 0,
            ..
        } if p == pid => Some(e.at),
        _ => None,
    })
}

#[test]
fn select_one_returns_one_row_and_session_is_listed() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let messages = a.client.simple_query(PING).await?;
        let SimpleQueryMessage::Row(row) = &messages[1] else {
            panic!("no row: {messages:?}");
        };
        assert_eq!(row.columns()[0].name(), "?column?");
        assert_eq!(row.get(0), Some("1"));
        assert_eq!(a.value("SELECT pg_is_in_recovery()").await?, "f");
        let pid = a.pid().await;
        let info = h.session(pid).unwrap();
        assert_eq!(
            (
                info.database.as_str(),
                info.user.as_str(),
                info.application_name.as_str()
            ),
            (DB, "a", "a")
        );
        assert_eq!(info.transaction, TransactionStatus::Idle);
        assert!(info.last_query_at.is_some());
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
}

#[test]
fn sessions_get_increasing_pids() {
    let mut sim = sim();
    server(
        &mut sim,
        "pg1",
        ServerConfig::default().with_first_pid(4000),
    );
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        drop(a);
        let c = Session::open("pg1", "c").await?;
        assert_eq!((b.pid().await, c.pid().await), (4001, 4002));
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn grant_statement_is_true_for_first_session_then_false_for_second() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        assert_eq!(b.value(&grant(20_000)).await?, "f");
        let (pa, pb) = (a.pid().await, b.pid().await);
        assert_eq!(h.holder(DB, LEADER), Some(pa));
        assert_eq!(
            h.session(pa).unwrap().idle_session_timeout,
            Duration::from_secs(20)
        );
        assert_eq!(h.session(pb).unwrap().idle_session_timeout, Duration::ZERO);
        assert_eq!(a.value("SHOW idle_session_timeout").await?, "20s");
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn try_lock_is_reentrant_within_a_session() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let lock = "SELECT pg_try_advisory_lock(1886156915, 1)";
        assert_eq!(a.value(lock).await?, "t");
        assert_eq!(a.value(lock).await?, "t");
        assert_eq!(h.locks()[0].count, 2);
        assert_eq!(b.value(lock).await?, "f");
        assert_eq!(a.value(UNLOCK).await?, "t");
        assert_eq!(b.value(lock).await?, "f", "count 1 still held");
        assert_eq!(a.value(UNLOCK).await?, "t");
        assert_eq!(b.value(lock).await?, "t");
        // The bigint with the same bits is another lock.
        let big = (1_886_156_915_i64 << 32) | 1;
        assert_eq!(
            a.value(&format!("SELECT pg_try_advisory_lock({big})"))
                .await?,
            "t"
        );
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
}

#[test]
fn unlock_is_false_with_warning_notice_when_not_held() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        assert_eq!(a.value(UNLOCK).await?, "f");
        sleep(Duration::from_millis(5)).await;
        {
            let notices = a.notices.borrow();
            assert_eq!(notices.len(), 1);
            assert_eq!(notices[0].severity(), "WARNING");
            assert_eq!(notices[0].code().code(), "01000");
            assert_eq!(
                notices[0].message(),
                "you don't own a lock of type ExclusiveLock"
            );
        }
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        assert_eq!(b.value(UNLOCK).await?, "f", "another session's lock");
        assert_eq!(a.value(UNLOCK).await?, "t");
        sleep(Duration::from_millis(5)).await;
        assert_eq!(a.notices.borrow().len(), 1, "no notice on success");
        assert_eq!(b.notices.borrow().len(), 1);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn unlock_all_releases_every_lock_of_the_session() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        a.value("SELECT pg_try_advisory_lock(1)").await?;
        a.value("SELECT pg_try_advisory_lock(1)").await?;
        a.value(&grant(0)).await?;
        assert_eq!(h.locks().len(), 2);
        assert_eq!(a.value("SELECT pg_advisory_unlock_all()").await?, "");
        assert_eq!(h.locks(), vec![]);
        Ok(())
    });
    sim.run().unwrap();
    let pid = 1000;
    assert_eq!(
        releases(&handle),
        vec![
            (pid, 0, ReleaseReason::UnlockAll),
            (pid, 0, ReleaseReason::UnlockAll)
        ]
    );
}

#[test]
fn lock_is_released_when_client_drops_the_connection() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        // Dropping the Client makes tokio-postgres send Terminate.
        let a = Session::open("pg1", "a").await?;
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        drop(a.client);
        sleep(Duration::from_millis(10)).await;
        assert_eq!(h.locks(), vec![]);
        // Aborting the connection task drops the socket without Terminate: a FIN.
        let b = Session::open("pg1", "b").await?;
        assert_eq!(b.value(&grant(20_000)).await?, "t");
        b.task.abort();
        sleep(Duration::from_millis(10)).await;
        assert_eq!(h.locks(), vec![]);
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(
        releases(&handle),
        vec![
            (
                1000,
                0,
                ReleaseReason::SessionEnd(EndReason::ClientTerminate)
            ),
            (1001, 0, ReleaseReason::SessionEnd(EndReason::ClientClosed)),
        ]
    );
}

/// turmoil's `Sim::crash` drops the host's runtime inside the simulated world, so every
/// socket of the crashed host is dropped and sends a FIN (a RST with unread data): the
/// server learns of the crash and releases the lock at once.
#[test]
fn lock_is_released_when_client_host_crashes_because_turmoil_sends_fin() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    sim.host("app", || async {
        let a = Session::open("pg1", "a").await?;
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        std::future::pending::<()>().await;
        Ok(())
    });
    while handle.holder(DB, LEADER).is_none() {
        sim.step().unwrap();
    }
    let crashed_at = sim.elapsed();
    sim.crash("app");
    for _ in 0..5 {
        sim.step().unwrap();
    }
    assert_eq!(handle.locks(), vec![]);
    assert_eq!(
        releases(&handle),
        vec![(1000, 0, ReleaseReason::SessionEnd(EndReason::ClientClosed))]
    );
    let released = release_time(&handle, 1000).unwrap();
    assert!(
        released <= crashed_at + Duration::from_millis(3),
        "{released:?}"
    );
}

/// A partition sends nothing: the orphaned session holds the lock until its idle session
/// timeout ends it, counted from its last query.
#[test]
fn partitioned_client_keeps_lock_until_idle_session_timeout() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    sim.host("app", || async {
        let a = Session::open("pg1", "a").await?;
        assert_eq!(a.value(&grant(2000)).await?, "t");
        loop {
            sleep(Duration::from_millis(500)).await;
            let _ignored = a.value(PING).await;
        }
    });
    sim.run_until_held(&handle);
    for _ in 0..1200 {
        sim.step().unwrap();
    }
    sim.partition("app", "pg1");
    let partitioned_at = sim.elapsed();
    let mut last_query = Duration::ZERO;
    while let Some(session) = handle.sessions().first() {
        last_query = session.last_query_at.unwrap();
        sim.step().unwrap();
        assert!(
            sim.elapsed() < partitioned_at + Duration::from_secs(3),
            "never released"
        );
    }
    let released = release_time(&handle, 1000).unwrap();
    let idle = released - last_query;
    assert!(
        idle >= Duration::from_millis(2000) && idle <= Duration::from_millis(2002),
        "{idle:?}"
    );
    assert_eq!(
        releases(&handle),
        vec![(
            1000,
            0,
            ReleaseReason::SessionEnd(EndReason::IdleSessionTimeout)
        )]
    );
}

trait RunUntil {
    fn run_until_held(&mut self, handle: &ServerHandle);
}

impl RunUntil for Sim<'_> {
    fn run_until_held(&mut self, handle: &ServerHandle) {
        while handle.holder(DB, LEADER).is_none() {
            self.step().unwrap();
        }
    }
}

#[test]
fn idle_session_timeout_ends_idle_session_with_57p05_and_frees_lock() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        assert_eq!(a.value(&grant(1000)).await?, "t");
        let answered = now();
        sleep(Duration::from_millis(990)).await;
        assert_eq!(a.ended_code(), None, "not yet");
        sleep(Duration::from_millis(20)).await;
        assert_eq!(a.ended_code().as_deref(), Some("57P05"));
        assert!(a.client.simple_query(PING).await.unwrap_err().is_closed());
        let pid = 1000;
        let released = release_time(&h, pid).unwrap();
        assert!(
            released > answered + Duration::from_millis(997),
            "{released:?}"
        );
        let b = Session::open("pg1", "b").await?;
        assert_eq!(b.value(&grant(1000)).await?, "t");
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(
        releases(&handle)[0],
        (
            1000,
            0,
            ReleaseReason::SessionEnd(EndReason::IdleSessionTimeout)
        )
    );
}

#[test]
fn idle_session_timeout_does_not_fire_while_queries_keep_coming() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        assert_eq!(a.value(&grant(1000)).await?, "t");
        for _ in 0..10 {
            sleep(Duration::from_millis(900)).await;
            assert_eq!(a.value(PING).await?, "1");
        }
        assert_eq!(a.ended_code(), None);
        sleep(Duration::from_millis(1100)).await;
        assert_eq!(a.ended_code().as_deref(), Some("57P05"));
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn idle_session_timeout_is_not_applied_inside_a_transaction_block() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        a.client
            .simple_query("SET idle_session_timeout = 1000")
            .await?;
        a.client.simple_query("BEGIN").await?;
        sleep(Duration::from_secs(3)).await;
        assert_eq!(a.ended_code(), None, "open block");
        assert!(a.client.simple_query("SELECT nope()").await.is_err());
        sleep(Duration::from_secs(3)).await;
        assert_eq!(a.ended_code(), None, "failed block");
        a.client.simple_query("ROLLBACK").await?;
        // The SET ran before BEGIN, so the rollback keeps it.
        sleep(Duration::from_millis(1100)).await;
        assert_eq!(a.ended_code().as_deref(), Some("57P05"));
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn zero_idle_session_timeout_disables_it() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        a.client
            .simple_query("SET idle_session_timeout TO '1s'")
            .await?;
        a.client
            .simple_query("SET idle_session_timeout = 0")
            .await?;
        sleep(Duration::from_secs(5)).await;
        assert_eq!(a.ended_code(), None);
        assert_eq!(a.value(PING).await?, "1");
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn timeout_set_forms_show_and_errors() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let show = "SHOW idle_session_timeout";
        assert_eq!(
            a.value("SELECT set_config('idle_session_timeout', '20000', false)")
                .await?,
            "20s"
        );
        a.client
            .simple_query("SET idle_session_timeout TO '1500ms'")
            .await?;
        assert_eq!(a.value(show).await?, "1500ms");
        a.client
            .simple_query("set idle_session_timeout = 3000")
            .await?;
        assert_eq!(a.value(show).await?, "3s");
        a.client
            .simple_query("SET idle_session_timeout TO DEFAULT")
            .await?;
        assert_eq!(a.value(show).await?, "0");
        let err = a
            .client
            .simple_query("SET idle_session_timeout = 'soon'")
            .await;
        assert_eq!(code(&err.unwrap_err()), "22023");
        a.client.simple_query("BEGIN").await?;
        a.value("SELECT set_config('idle_session_timeout', '5000', false)")
            .await?;
        a.client.simple_query("ROLLBACK").await?;
        assert_eq!(a.value(show).await?, "0", "rolled back");
        a.client
            .simple_query("SET application_name = 'renamed'")
            .await?;
        assert_eq!(
            a.value("SELECT current_setting('application_name')")
                .await?,
            "renamed"
        );
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn unsupported_statements_and_function_calls_fail_but_session_goes_on() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let err = a
            .client
            .simple_query("DELETE FROM leaders")
            .await
            .unwrap_err();
        assert_eq!(code(&err), "0A000");
        let err = a.client.simple_query("SELECT CASE").await.unwrap_err();
        assert_eq!(code(&err), "42601");
        let err = a
            .client
            .query("SELECT $1::int4", &[&1_i32])
            .await
            .unwrap_err();
        assert_eq!(code(&err), "42601", "parameters are not modelled");
        let messages = a.client.simple_query("").await?;
        assert!(matches!(
            messages[..],
            [SimpleQueryMessage::CommandComplete(0)]
        ));
        assert_eq!(a.value(PING).await?, "1");
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn terminate_backend_ends_idle_session_with_57p01_and_frees_lock() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        let pid = a.pid().await;
        assert!(!h.terminate_backend(9999));
        assert!(h.terminate_backend(pid));
        sleep(Duration::from_millis(5)).await;
        assert_eq!(a.ended_code().as_deref(), Some("57P01"));
        assert!(a.client.simple_query(PING).await.unwrap_err().is_closed());
        assert_eq!(h.locks(), vec![]);
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(
        releases(&handle),
        vec![(1000, 0, ReleaseReason::SessionEnd(EndReason::Terminated))]
    );
}

#[test]
fn pg_terminate_backend_from_another_session_ends_it_with_57p01() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let c = Session::open("pg1", "c").await?;
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        let pid = a.pid().await;
        let query = format!("SELECT pg_terminate_backend({pid})");
        assert_eq!(c.value(&query).await?, "t");
        sleep(Duration::from_millis(5)).await;
        assert_eq!(a.ended_code().as_deref(), Some("57P01"));
        assert_eq!(h.locks(), vec![]);
        assert_eq!(c.value("SELECT pg_terminate_backend(4242)").await?, "f");
        let warning = c.notices.borrow().last().map(|n| n.message().to_owned());
        assert_eq!(
            warning.as_deref(),
            Some("PID 4242 is not a PostgreSQL backend process")
        );
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn statement_log_records_arrival_and_answer_of_every_query() {
    let mut sim = sim();
    let handle = server(
        &mut sim,
        "pg1",
        ServerConfig::default().with_query_latency(Duration::from_millis(50)),
    );
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        a.value(PING).await?;
        sleep(Duration::from_millis(100)).await;
        a.value(PING).await?;
        Ok(())
    });
    sim.run().unwrap();
    let queries = handle.queries();
    assert_eq!(queries.len(), 2);
    for query in &queries {
        assert_eq!(query.pid, 1000);
        assert_eq!(
            query.answered,
            Some(query.received + Duration::from_millis(50))
        );
    }
    let idle = queries[1].received - queries[0].answered.unwrap();
    assert!(idle >= Duration::from_millis(100) && idle < Duration::from_millis(105));
}

#[test]
fn terminate_backend_fails_the_query_in_flight_with_57p01() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let pid = a.pid().await;
        h.set_query_latency(Duration::from_secs(5));
        let started = now();
        let query = a.client.simple_query(PING);
        let kill = async {
            sleep(Duration::from_secs(1)).await;
            h.terminate_backend(pid);
        };
        let (result, ()) = tokio::join!(query, kill);
        assert_eq!(code(&result.unwrap_err()), "57P01");
        assert!(now() - started < Duration::from_millis(1010));
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn query_latency_delays_every_reply() {
    let mut sim = sim();
    let handle = server(
        &mut sim,
        "pg1",
        ServerConfig::default().with_query_latency(Duration::from_millis(250)),
    );
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let started = now();
        a.value(PING).await?;
        let took = now() - started;
        assert!(took >= Duration::from_millis(250) && took < Duration::from_millis(260));
        h.set_query_latency(Duration::ZERO);
        let started = now();
        a.value(PING).await?;
        assert!(now() - started < Duration::from_millis(10));
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn crash_drops_every_session_and_restart_starts_empty_with_new_pids() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        h.crash();
        sleep(Duration::from_millis(10)).await;
        assert!(!h.is_running());
        assert_eq!(h.locks(), vec![]);
        assert_eq!(h.sessions(), vec![]);
        // No message: the sockets just close.
        assert!(a.ended.borrow().is_some());
        assert_eq!(a.ended_code().as_deref(), Some(""));
        assert!(a.client.simple_query(PING).await.unwrap_err().is_closed());
        assert!(b.client.simple_query(PING).await.unwrap_err().is_closed());
        assert!(matches!(
            Session::open("pg1", "c").await,
            Err(ConnectError::Tcp { .. })
        ));
        h.restart();
        sleep(Duration::from_millis(10)).await;
        assert!(h.is_running());
        let c = Session::open("pg1", "c").await?;
        assert_eq!(c.pid().await, 1002);
        assert_eq!(c.value(&grant(20_000)).await?, "t");
        drop(c.client);
        sleep(Duration::from_millis(10)).await;
        Ok(())
    });
    sim.run().unwrap();
    let kinds: Vec<String> = handle
        .log()
        .iter()
        .map(|e| match &e.event {
            Event::ServerStarted => "start".to_owned(),
            Event::ServerCrashed => "crash".to_owned(),
            Event::SessionStarted { pid, .. } => format!("open {pid}"),
            Event::SessionEnded { pid, reason, .. } => format!("end {pid} {reason:?}"),
            Event::LockGranted { pid, .. } => format!("grant {pid}"),
            Event::LockReleased { pid, reason, .. } => format!("release {pid} {reason:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "start",
            "open 1000",
            "open 1001",
            "grant 1000",
            "release 1000 SessionEnd(Crash)",
            "end 1000 Crash",
            "end 1001 Crash",
            "crash",
            "start",
            "open 1002",
            "grant 1002",
            "release 1002 SessionEnd(ClientTerminate)",
            "end 1002 ClientTerminate",
        ]
    );
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
}

#[test]
fn crash_and_restart_requested_together_restart_the_server() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    sim.step().unwrap();
    handle.crash();
    handle.restart();
    sim.step().unwrap();
    assert!(handle.is_running());
    let events: Vec<Event> = handle.log().into_iter().map(|e| e.event).collect();
    assert_eq!(
        events,
        [
            Event::ServerStarted,
            Event::ServerCrashed,
            Event::ServerStarted
        ]
    );
}

/// A turmoil crash of the server host drops its software: the instance loses its
/// sessions and locks; a bounce starts it again, empty.
#[test]
fn turmoil_crash_of_server_host_loses_locks_and_bounce_restarts_empty() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let reconnected = Rc::new(Cell::new(false));
    let flag = Rc::clone(&reconnected);
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        while a.ended.borrow().is_none() {
            sleep(Duration::from_millis(10)).await;
        }
        let b = loop {
            match Session::open("pg1", "b").await {
                Ok(b) => break b,
                Err(_) => sleep(Duration::from_millis(100)).await,
            }
        };
        assert_eq!(b.value(&grant(20_000)).await?, "t");
        flag.set(true);
        Ok(())
    });
    sim.run_until_held(&handle);
    sim.crash("pg1");
    assert!(!handle.is_running());
    assert_eq!(handle.locks(), vec![]);
    for _ in 0..500 {
        sim.step().unwrap();
    }
    assert!(
        !reconnected.get(),
        "connects are refused while the host is down"
    );
    sim.bounce("pg1");
    sim.run().unwrap();
    assert!(reconnected.get());
    assert_eq!(
        releases(&handle)[0],
        (1000, 0, ReleaseReason::SessionEnd(EndReason::Crash))
    );
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
}

#[test]
fn two_instances_are_independent_and_failover_target_grants_the_lock() {
    let mut sim = sim();
    let pg1 = server(&mut sim, "pg1", ServerConfig::default());
    let pg2 = server(
        &mut sim,
        "pg2",
        ServerConfig::default().with_first_pid(5000),
    );
    let primary = Primary::new("pg1");
    let (h1, h2) = (pg1.clone(), pg2.clone());
    sim.client("app", async move {
        let a = Session::open(&primary.host(), "a").await?;
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        primary.fail_over_to("pg2");
        let b = Session::open(&primary.host(), "b").await?;
        assert_eq!(
            b.value(&grant(20_000)).await?,
            "t",
            "pg2 never saw the lock"
        );
        assert_eq!(h1.holder(DB, LEADER), Some(1000));
        assert_eq!(h2.holder(DB, LEADER), Some(5000));
        assert_eq!(a.value(PING).await?, "1", "the old primary still serves a");
        Ok(())
    });
    sim.run().unwrap();
    assert!(pg2.log().iter().all(|e| !matches!(
        &e.event,
        Event::SessionStarted { user, .. } if user == "a"
    )));
}

#[test]
fn locks_are_scoped_to_the_database() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let mut config = Config::new();
        config.user("b").dbname("other");
        let (other, connection) = connect_with("pg1", PORT, &config).await?;
        tokio::task::spawn_local(connection);
        assert_eq!(a.value(&grant(20_000)).await?, "t");
        let rows = other.simple_query(&grant(20_000)).await?;
        let SimpleQueryMessage::Row(row) = &rows[1] else {
            panic!("no row");
        };
        assert_eq!(row.get(0), Some("t"));
        Ok(())
    });
    sim.run().unwrap();
}

/// Every grant and release is in the log, stamped with a time between the client's
/// sending of the statement that caused it and the client's receipt of the answer.
#[test]
fn ground_truth_log_records_grants_and_releases_at_the_right_times() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let windows = Rc::new(RefCell::new(Vec::new()));
    let w = Rc::clone(&windows);
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let timed = |what: &'static str, sent: Duration| w.borrow_mut().push((what, sent, now()));
        sleep(Duration::from_millis(100)).await;
        let sent = now();
        a.value(&grant(20_000)).await?;
        timed("grant a", sent);
        sleep(Duration::from_millis(100)).await;
        assert_eq!(b.value(&grant(20_000)).await?, "f");
        sleep(Duration::from_millis(100)).await;
        let sent = now();
        a.value(UNLOCK).await?;
        timed("unlock a", sent);
        let sent = now();
        b.value(&grant(20_000)).await?;
        timed("grant b", sent);
        sleep(Duration::from_millis(100)).await;
        let sent = now();
        drop(b.client);
        while b.ended.borrow().is_none() {
            sleep(Duration::from_millis(1)).await;
        }
        timed("close b", sent);
        Ok(())
    });
    sim.run().unwrap();
    let lock = LockId {
        database: DB.to_owned(),
        key: LEADER,
    };
    let expected = [
        Event::LockGranted {
            pid: 1000,
            lock: lock.clone(),
            count: 1,
            mode: LockMode::Exclusive,
        },
        Event::LockReleased {
            pid: 1000,
            lock: lock.clone(),
            remaining: 0,
            reason: ReleaseReason::Unlock,
            mode: LockMode::Exclusive,
        },
        Event::LockGranted {
            pid: 1001,
            lock: lock.clone(),
            count: 1,
            mode: LockMode::Exclusive,
        },
        Event::LockReleased {
            pid: 1001,
            lock,
            remaining: 0,
            reason: ReleaseReason::SessionEnd(EndReason::ClientTerminate),
            mode: LockMode::Exclusive,
        },
    ];
    let lock_events: Vec<_> = handle
        .log()
        .into_iter()
        .filter(|e| {
            matches!(
                e.event,
                Event::LockGranted { .. } | Event::LockReleased { .. }
            )
        })
        .collect();
    assert_eq!(
        lock_events
            .iter()
            .map(|e| e.event.clone())
            .collect::<Vec<_>>(),
        expected
    );
    for (entry, (what, sent, answered)) in lock_events.iter().zip(windows.borrow().iter()) {
        assert!(
            *sent < entry.at && entry.at <= *answered,
            "{what}: {:?} not in ({sent:?}, {answered:?})",
            entry.at
        );
    }
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
}

/// The same scenario run twice gives the same log, times included.
#[test]
fn runs_are_deterministic() {
    fn run_once() -> Vec<plexsphere_leader_pgsim::LogEntry> {
        let mut sim = Builder::new()
            .simulation_duration(Duration::from_secs(60))
            .rng_seed(7)
            .build();
        let handle = server(&mut sim, "pg1", ServerConfig::default());
        for name in ["a", "b", "c"] {
            sim.client(name, async move {
                let s = Session::open("pg1", name).await?;
                for _ in 0..5 {
                    let _held = s.value(&grant(1000)).await?;
                    sleep(Duration::from_millis(200)).await;
                }
                Ok(())
            });
        }
        sim.run().unwrap();
        assert_eq!(handle.check_mutual_exclusion(), Ok(()));
        handle.log()
    }
    let first = run_once();
    assert!(first.len() > 6);
    assert_eq!(first, run_once());
}

// ---------------------------------------------------------------------------------------
// The adapter's grant, check, queued-wait and fencing statements (`plexsphere_leader::sql`).
// ---------------------------------------------------------------------------------------

use plexsphere_leader::sql;

/// The election's key in these tests: the default one.
const KEY: plexsphere_leader::LockKey = plexsphere_leader::LockKey::DEFAULT;
/// The identity the grant statements write into `application_name`.
const IDENTITY: &str = "sim-test";

/// The sessions' idle timeout the grant statements set, in ms.
const BOUND_MS: u32 = 20_000;

fn sim_long<'a>() -> Sim<'a> {
    Builder::new()
        .simulation_duration(Duration::from_secs(600))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(1))
        .build()
}

fn grant_time(handle: &ServerHandle, pid: i32) -> Option<Duration> {
    handle.log().into_iter().find_map(|e| match e.event {
        Event::LockGranted {
            pid: p, count: 1, ..
        } if p == pid => Some(e.at),
        _ => None,
    })
}

#[test]
fn try_lock_answers_granted_refused_and_shared_with_the_pid_and_bounds_only_the_winner() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let (pa, pb) = (a.pid().await, b.pid().await);
        let (names, values) = a
            .row(&sql::try_lock(KEY, IDENTITY, BOUND_MS))
            .await?
            .unwrap();
        assert_eq!(
            names,
            [
                "set_config",
                "pg_backend_pid",
                "current_database",
                "current_setting",
                "concat"
            ]
        );
        assert_eq!(values[..3], ["granted", &pa.to_string(), DB]);
        assert_eq!(
            b.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?[..3],
            ["refused", &pb.to_string(), DB]
        );
        // The same session asking again: the lock is not taken twice, the session is marked.
        assert_eq!(
            a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?[..3],
            ["shared", &pa.to_string(), DB]
        );
        assert_eq!(h.session(pa).unwrap().locks, vec![(LEADER, 1)]);
        assert_eq!(
            h.session(pa).unwrap().idle_session_timeout,
            Duration::from_secs(20)
        );
        assert_eq!(h.session(pb).unwrap().idle_session_timeout, Duration::ZERO);
        assert_eq!(
            a.value("SHOW idle_in_transaction_session_timeout").await?,
            "20s"
        );
        assert_eq!(
            b.value("SHOW idle_in_transaction_session_timeout").await?,
            "0"
        );
        assert_eq!(
            a.value("SELECT current_setting('plexsphere.leader_session')")
                .await?,
            "shared"
        );
        let (names, _) = b.row(UNBOUNDED_GRANT).await?.unwrap();
        assert_eq!(names, ["case", "pg_backend_pid"]);
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
}

#[test]
fn a_hot_standby_answers_in_recovery_and_takes_no_lock() {
    let mut sim = sim();
    let handle = server(
        &mut sim,
        "pg1",
        ServerConfig::default().with_in_recovery(true),
    );
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let pa = a.pid().await;
        assert_eq!(a.value("SELECT pg_is_in_recovery()").await?, "t");
        assert_eq!(
            a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?[..3],
            ["in_recovery", &pa.to_string(), DB]
        );
        assert_eq!(
            a.values(&sql::wait_for_lock(KEY, IDENTITY, 100, BOUND_MS))
                .await?[..3],
            ["in_recovery", &pa.to_string(), DB]
        );
        assert_eq!(h.locks(), vec![]);
        // Advisory locks themselves work on a standby, as in PostgreSQL: the check's re-entrant
        // try takes the free lock, and answers that the server is in recovery.
        assert_eq!(a.value("SELECT pg_try_advisory_lock(7)").await?, "t");
        assert_eq!(
            a.values(&sql::verify(KEY)).await?[..4],
            [pa.to_string(), "t".into(), "t".into(), "NULL".into()]
        );
        assert_eq!(a.value(&sql::unlock(KEY)).await?, "t");
        h.promote();
        assert!(!h.is_in_recovery());
        assert_eq!(
            a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?[..3],
            ["granted", &pa.to_string(), DB]
        );
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn verify_reports_pid_recovery_holding_and_marker_before_and_after_unlock() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let (pa, pb) = (a.pid().await.to_string(), b.pid().await.to_string());
        let (names, values) = b.row(&sql::verify(KEY)).await?.unwrap();
        assert_eq!(
            names,
            [
                "pg_backend_pid",
                "pg_is_in_recovery",
                "pg_try_advisory_lock",
                "current_setting",
                "set_config"
            ]
        );
        // The check's re-entrant try takes a free lock (b holds it now, unmarked) ...
        assert_eq!(
            values[..4],
            [pb.clone(), "f".into(), "t".into(), "NULL".into()]
        );
        assert_eq!(
            values[4].len(),
            10,
            "the check's stamp, unix seconds: {values:?}"
        );
        // ... and the release gives back every hold, the check's included.
        assert_eq!(b.value(&sql::verify(KEY)).await?, pb);
        assert_eq!(b.value(&sql::unlock(KEY)).await?, "t");
        assert_eq!(b.value(&sql::unlock(KEY)).await?, "f");
        a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?;
        assert_eq!(
            a.values(&sql::verify(KEY)).await?[..4],
            [pa.clone(), "f".into(), "t".into(), "granted".into()]
        );
        // b's unlock cleared its mark (set once, so now empty rather than NULL).
        assert_eq!(
            b.values(&sql::verify(KEY)).await?[..4],
            [pb.clone(), "f".into(), "f".into(), String::new()],
            "another session holds it: refused, nothing changed"
        );
        assert_eq!(a.value(&sql::unlock(KEY)).await?, "t");
        assert_eq!(
            b.values(&sql::verify(KEY)).await?[..4],
            [pb, "f".into(), "t".into(), String::new()],
            "free again after the release"
        );
        assert_eq!(
            a.values(&sql::verify(KEY)).await?[..4],
            [pa, "f".into(), "f".into(), String::new()],
            "a's unlock cleared its mark"
        );
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn exists_over_pg_locks_tests_each_column_and_sees_waiters_as_not_granted() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let pa = a.pid().await;
        a.value("SELECT pg_try_advisory_lock(1886156915, 1)")
            .await?;
        a.value("SELECT pg_try_advisory_lock(-1, 5)").await?;
        a.value("SELECT pg_try_advisory_lock(8589934597)").await?; // 2 << 32 | 5
        let exists = |cond: &str| {
            format!("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND {cond})")
        };
        for (cond, want) in [
            ("classid = 1886156915 AND objid = 1 AND objsubid = 2", "t"),
            ("classid = 1886156915 AND objid = 1 AND objsubid = 1", "f"),
            ("classid = 4294967295 AND objid = 5", "t"),
            ("classid = -1 AND objid = 5", "t"),
            ("classid = 2 AND objid = 5 AND objsubid = 1", "t"),
            (&format!("pid = {pa} AND granted"), "t"),
            ("granted = false", "f"),
        ] {
            assert_eq!(a.value(&exists(cond)).await?, want, "{cond}");
        }
        assert_eq!(
            b.value(&exists("pid = pg_backend_pid()")).await?,
            "f",
            "b holds nothing"
        );
        // b waits for the leader lock: its row is there, not granted.
        let waiting = tokio::task::spawn_local(async move {
            let answer = b.values("SELECT pg_advisory_lock(1886156915, 1)").await;
            (b, answer)
        });
        sleep(Duration::from_millis(50)).await;
        assert!(
            a.value(&exists("objid = 1 AND NOT_GRANTED")).await.is_err(),
            "unknown column"
        );
        assert_eq!(
            a.value(&exists("objid = 1 AND granted = false")).await?,
            "t"
        );
        assert_eq!(a.value("SELECT pg_advisory_unlock_all()").await?, "");
        let (b, answer) = waiting.await.unwrap();
        assert_eq!(answer?, [""]);
        assert_eq!(
            b.value(&exists("pid = pg_backend_pid() AND granted"))
                .await?,
            "t"
        );
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn not_and_several_columns_are_one_row_named_as_postgresql_names_them() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let (names, values) = a
            .row("SELECT 1, 'a', true, NULL, 1 IS NULL, NOT true, NOT NULL, pg_advisory_unlock(3)")
            .await?
            .unwrap();
        assert_eq!(
            names,
            [
                "?column?",
                "?column?",
                "bool",
                "?column?",
                "?column?",
                "?column?",
                "?column?",
                "pg_advisory_unlock"
            ]
        );
        assert_eq!(values, ["1", "a", "t", "NULL", "f", "f", "NULL", "f"]);
        let error = a.client.simple_query("SELECT NOT 1").await.unwrap_err();
        assert_eq!(code(&error), "42804");
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn advisory_lock_returns_void_at_once_when_free_and_is_reentrant() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let pa = a.pid().await;
        let (names, values) = a
            .row("SELECT pg_advisory_lock(1886156915, 1), pg_advisory_lock(1886156915, 1) IS NULL")
            .await?
            .unwrap();
        assert_eq!(names, ["pg_advisory_lock", "?column?"]);
        assert_eq!(values, ["", "f"]);
        assert_eq!(a.value("SELECT pg_advisory_lock(9)").await?, "");
        assert_eq!(
            h.session(pa).unwrap().locks,
            vec![(LEADER, 2), (LockKey::BigInt(9), 1)]
        );
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn queued_waiters_are_granted_in_fifo_order_on_unlock_and_on_session_end() {
    let mut sim = sim_long();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let c = Session::open("pg1", "c").await?;
        let (pb, pc) = (b.pid().await, c.pid().await);
        assert_eq!(
            a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?[0],
            "granted"
        );
        let b_task = tokio::task::spawn_local(async move {
            let answer = b
                .values(&sql::wait_for_lock(KEY, IDENTITY, 0, BOUND_MS))
                .await;
            (b, answer, now())
        });
        sleep(Duration::from_millis(10)).await;
        // An idle timeout does not run while the session's statement waits.
        c.client
            .simple_query("SET idle_session_timeout = 1000")
            .await?;
        let c_task = tokio::task::spawn_local(async move {
            let answer = c
                .values(&sql::wait_for_lock(KEY, IDENTITY, 0, BOUND_MS))
                .await;
            (c, answer, now())
        });
        // a's grant set its idle_session_timeout to 20 s: stay below it.
        sleep(Duration::from_secs(15)).await;
        // No limit (lock_timeout 0), and no idle timeout while a statement waits.
        let waiting: Vec<i32> = h.waiters().into_iter().map(|(_, pid)| pid).collect();
        assert_eq!(waiting, [pb, pc]);
        assert_eq!(a.value(&sql::unlock(KEY)).await?, "t");
        let (b, answer, b_at) = b_task.await.unwrap();
        assert_eq!(answer?[..3], ["granted", &pb.to_string(), DB]);
        assert_eq!(h.holder(DB, LEADER), Some(pb));
        assert_eq!(grant_time(&h, pb), Some(b_at - Duration::from_millis(1)));
        assert_eq!(
            b.value("SHOW lock_timeout").await?,
            "0",
            "the local lock_timeout is gone"
        );
        assert_eq!(
            h.session(pb).unwrap().idle_session_timeout,
            Duration::from_secs(20)
        );
        // b's session ends: the lock goes straight to c.
        sleep(Duration::from_secs(1)).await;
        let b_end = now();
        drop(b);
        let (c, answer, _) = c_task.await.unwrap();
        assert_eq!(answer?[..3], ["granted", &pc.to_string(), DB]);
        assert_eq!(h.holder(DB, LEADER), Some(pc));
        assert_eq!(grant_time(&h, pc), release_time(&h, pb));
        assert!(grant_time(&h, pc).unwrap() - b_end <= Duration::from_millis(2));
        assert_eq!(h.waiters(), vec![]);
        drop(c);
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
}

#[test]
fn lock_timeout_fails_the_wait_with_55p03_and_rolls_back_the_local_setting() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let pb = b.pid().await;
        a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?;
        let start = now();
        let error = b
            .client
            .simple_query(&sql::wait_for_lock(KEY, IDENTITY, 200, BOUND_MS))
            .await
            .unwrap_err();
        let took = now() - start;
        let db = error.as_db_error().unwrap();
        assert_eq!(
            (db.code().code(), db.severity(), db.message()),
            ("55P03", "ERROR", "canceling statement due to lock timeout")
        );
        assert!(
            took >= Duration::from_millis(200) && took <= Duration::from_millis(203),
            "{took:?}"
        );
        assert_eq!(h.waiters(), vec![]);
        assert_eq!(b.value("SHOW lock_timeout").await?, "0");
        assert_eq!(h.session(pb).unwrap().idle_session_timeout, Duration::ZERO);
        assert_eq!(h.session(pb).unwrap().transaction, TransactionStatus::Idle);
        // The lock is not handed to the session that gave up.
        assert_eq!(a.value(&sql::unlock(KEY)).await?, "t");
        assert_eq!(h.holder(DB, LEADER), None);
        // A session-level lock_timeout applies as well, and set_config's local value wins.
        b.client.simple_query("SET lock_timeout = '5s'").await?;
        a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?;
        let start = now();
        let error = b
            .client
            .simple_query("SELECT pg_advisory_lock(1886156915, 1)")
            .await
            .unwrap_err();
        assert_eq!(code(&error), "55P03");
        assert!(now() - start >= Duration::from_secs(5));
        assert!(
            b.client
                .simple_query(&sql::wait_for_lock(KEY, IDENTITY, 300, BOUND_MS))
                .await
                .is_err()
        );
        assert_eq!(b.value("SHOW lock_timeout").await?, "5s");
        Ok(())
    });
    sim.run().unwrap();
}

/// What a queued wait ended with when the lock was freed around the tick its `lock_timeout`
/// was due: its answer (the outcome, or the SQLSTATE), whether its session then held the
/// lock, whether the server logged the race, and what the elector's release-if-held
/// statement answered on that session.
#[derive(Debug, PartialEq, Eq)]
struct RaceOutcome {
    answer: Result<String, String>,
    holds: bool,
    logged: bool,
    released: String,
}

/// Session a holds the lock, session b waits for it with a `lock_timeout` of 200 ms, and the
/// server ends a's session (freeing the lock) `offset` ticks after the tick b's timeout is due.
fn free_the_lock_around_the_timeout(offset: i8) -> RaceOutcome {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    let outcome = Rc::new(RefCell::new(None));
    let out = Rc::clone(&outcome);
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let (pa, pb) = (a.pid().await, b.pid().await);
        a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?;
        let b_task = tokio::task::spawn_local(async move {
            let answer = b
                .values(&sql::wait_for_lock(KEY, IDENTITY, 200, BOUND_MS))
                .await
                .map(|row| row[0].clone())
                .map_err(|e| code(&e));
            (b, answer)
        });
        sleep(Duration::from_millis(10)).await;
        let due = h.queries().last().unwrap().received + Duration::from_millis(200);
        let freed = match offset {
            0.. => due + Duration::from_millis(offset.unsigned_abs().into()),
            _ => due - Duration::from_millis(offset.unsigned_abs().into()),
        };
        // The server host steps before this one: it ends a's session in the next tick.
        sleep(freed - Duration::from_millis(1) - now()).await;
        assert!(h.terminate_backend(pa));
        let (b, answer) = b_task.await.unwrap();
        assert_eq!(release_time(&h, pa), Some(freed));
        let holds = h.holder(DB, LEADER) == Some(pb);
        let logged = h.log().iter().any(|entry| {
            entry.at == freed
                && matches!(entry.event, Event::GrantedAtLockTimeout { pid, .. } if pid == pb)
        });
        let released = b.value(&sql::release_if_held(KEY)).await?;
        assert_eq!(h.holder(DB, LEADER), None);
        *out.borrow_mut() = Some(RaceOutcome {
            answer,
            holds,
            logged,
            released,
        });
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
    outcome.take().unwrap()
}

/// PostgreSQL's grant-at-timeout race: a queued `pg_advisory_lock` granted in the instant its
/// `lock_timeout` fires still fails with 55P03, and the session keeps the lock (a
/// session-level lock outlives the failed statement) until the client releases it, as the
/// elector's release-if-held does. In the model that instant is the tick: the lock freed a
/// tick before the timeout is due is granted; freed in that tick, it is granted and the wait
/// still fails with 55P03; a tick later the waiter has left the queue and the lock stays free.
#[test]
fn a_wait_granted_in_the_tick_its_lock_timeout_fires_fails_with_55p03_and_keeps_the_lock() {
    let outcome = |answer: Result<&str, &str>, holds, logged, released: &str| RaceOutcome {
        answer: answer.map(str::to_owned).map_err(str::to_owned),
        holds,
        logged,
        released: released.to_owned(),
    };
    assert_eq!(
        free_the_lock_around_the_timeout(-1),
        outcome(Ok("granted"), true, false, "t")
    );
    assert_eq!(
        free_the_lock_around_the_timeout(0),
        outcome(Err("55P03"), true, true, "t")
    );
    assert_eq!(
        free_the_lock_around_the_timeout(1),
        outcome(Err("55P03"), false, false, "f")
    );
}

#[test]
fn lock_timeout_in_a_block_fails_the_block_and_rollback_restores_settings() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?;
        b.client.simple_query("BEGIN").await?;
        let error = b
            .client
            .simple_query(&sql::wait_for_lock(KEY, IDENTITY, 100, BOUND_MS))
            .await
            .unwrap_err();
        assert_eq!(code(&error), "55P03");
        let error = b
            .client
            .simple_query("SHOW lock_timeout")
            .await
            .unwrap_err();
        assert_eq!(code(&error), "25P02");
        b.client.simple_query("ROLLBACK").await?;
        assert_eq!(b.value("SHOW lock_timeout").await?, "0");
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn terminate_backend_ends_a_waiting_session_with_57p01_and_it_leaves_the_queue() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let pb = b.pid().await;
        a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?;
        let b_task = tokio::task::spawn_local(async move {
            let answer = b
                .client
                .simple_query(&sql::wait_for_lock(KEY, IDENTITY, 0, BOUND_MS))
                .await;
            answer.map(|_| ()).map_err(|e| code(&e))
        });
        sleep(Duration::from_millis(100)).await;
        assert!(h.terminate_backend(pb));
        assert_eq!(b_task.await.unwrap(), Err("57P01".to_owned()));
        assert_eq!(h.waiters(), vec![]);
        assert_eq!(a.value(&sql::unlock(KEY)).await?, "t");
        assert_eq!(h.holder(DB, LEADER), None);
        Ok(())
    });
    sim.run().unwrap();
}

/// As PostgreSQL with `client_connection_check_interval = 0`: the backend does not watch
/// the socket while it waits, so it is granted the lock in its turn and frees it as soon as
/// it finds the connection closed.
#[test]
fn a_waiter_whose_client_went_away_is_granted_in_turn_and_frees_the_lock_at_once() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let c = Session::open("pg1", "c").await?;
        let (pb, pc) = (b.pid().await, c.pid().await);
        a.values(&sql::try_lock(KEY, IDENTITY, BOUND_MS)).await?;
        let b_task = tokio::task::spawn_local(async move {
            let _lost = b
                .client
                .simple_query("SELECT pg_advisory_lock(1886156915, 1)")
                .await;
        });
        sleep(Duration::from_millis(10)).await;
        let c_task = tokio::task::spawn_local(async move {
            let answer = c
                .values(&sql::wait_for_lock(KEY, IDENTITY, 0, BOUND_MS))
                .await;
            (c, answer)
        });
        sleep(Duration::from_millis(10)).await;
        b_task.abort(); // drops b's client: its connection closes
        sleep(Duration::from_millis(100)).await;
        assert!(
            h.session(pb).is_some(),
            "the waiting backend did not notice"
        );
        assert_eq!(a.value(&sql::unlock(KEY)).await?, "t");
        let (_c, answer) = c_task.await.unwrap();
        assert_eq!(answer?[..3], ["granted", &pc.to_string(), DB]);
        assert!(h.session(pb).is_none());
        assert_eq!(grant_time(&h, pc), release_time(&h, pb));
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
}

#[test]
fn set_config_local_reverts_at_the_end_of_the_transaction_and_placeholders_behave() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        assert_eq!(
            a.values("SELECT set_config('lock_timeout', '200', true), current_setting('lock_timeout')")
                .await?,
            ["200ms", "200ms"]
        );
        assert_eq!(a.value("SHOW lock_timeout").await?, "0");
        assert_eq!(
            a.value("SELECT set_config('lock_timeout', '200', false)").await?,
            "200ms"
        );
        assert_eq!(a.value("SHOW lock_timeout").await?, "200ms");
        // In a block, a local value lasts until COMMIT; a later SET in the block is kept.
        a.client.simple_query("BEGIN").await?;
        a.value("SELECT set_config('lock_timeout', '1s', true)").await?;
        assert_eq!(a.value("SHOW lock_timeout").await?, "1s");
        a.client.simple_query("SET idle_session_timeout = 3000").await?;
        a.client.simple_query("COMMIT").await?;
        assert_eq!(a.value("SHOW lock_timeout").await?, "200ms");
        assert_eq!(a.value("SHOW idle_session_timeout").await?, "3s");
        a.client.simple_query("SET idle_session_timeout = 0").await?;
        // Placeholders.
        let missing = "SELECT current_setting('plexsphere.leader_session', true)";
        assert_eq!(a.value(missing).await?, "NULL");
        assert_eq!(a.value("SELECT current_setting('nosuch', true)").await?, "NULL");
        let error = a
            .client
            .simple_query("SELECT current_setting('plexsphere.leader_session')")
            .await
            .unwrap_err();
        let db = error.as_db_error().unwrap();
        assert_eq!(
            (db.code().code(), db.message()),
            (
                "42704",
                "unrecognized configuration parameter \"plexsphere.leader_session\""
            )
        );
        assert_eq!(
            a.value("SELECT set_config('plexsphere.leader_session', 'x', true)")
                .await?,
            "x"
        );
        assert_eq!(a.value(missing).await?, "", "exists, reset, after the transaction");
        assert_eq!(
            a.values("SELECT set_config('Plexsphere.Leader_Session', 'y', false), current_setting('plexsphere.leader_session')")
                .await?,
            ["y", "y"]
        );
        let error = a.client.simple_query("SELECT set_config('nosuch', '1', false)").await.unwrap_err();
        assert_eq!(code(&error), "42704");
        let error = a.client.simple_query("SET lock_timeout = 'x'").await.unwrap_err();
        assert_eq!(code(&error), "22023");
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn idle_in_transaction_session_timeout_ends_an_idle_open_block_with_25p03() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let pa = a.pid().await;
        a.values(&sql::try_lock(KEY, IDENTITY, 1000)).await?;
        // Outside a block only idle_session_timeout applies; queries keep it alive.
        a.client
            .simple_query("SET idle_session_timeout = 0")
            .await?;
        sleep(Duration::from_secs(3)).await;
        assert_eq!(a.ended_code(), None);
        a.client.simple_query("BEGIN").await?;
        sleep(Duration::from_millis(900)).await;
        a.value(PING).await?;
        sleep(Duration::from_millis(900)).await;
        assert_eq!(a.ended_code(), None, "the timer restarts at each query");
        sleep(Duration::from_millis(200)).await;
        let db_end = a.ended.borrow().as_ref().map(|r| match r {
            Err(e) => e
                .as_db_error()
                .map(|d| (d.severity().to_owned(), d.message().to_owned())),
            Ok(()) => None,
        });
        assert_eq!(
            db_end,
            Some(Some((
                "FATAL".to_owned(),
                "terminating connection due to idle-in-transaction timeout".to_owned()
            )))
        );
        assert_eq!(a.ended_code().as_deref(), Some("25P03"));
        assert_eq!(h.holder(DB, LEADER), None);
        assert_eq!(
            releases(&h),
            [(
                pa,
                0,
                ReleaseReason::SessionEnd(EndReason::IdleInTransactionSessionTimeout)
            )]
        );
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn fence_table_is_absent_until_setup_then_epochs_advance_per_key() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        for query in [sql::fence_check(KEY), sql::advance_epoch(KEY)] {
            let error = a.client.simple_query(&query).await.unwrap_err();
            let db = error.as_db_error().unwrap();
            assert_eq!(
                (db.code().code(), db.message()),
                ("42P01", "relation \"plexsphere_leader_fence\" does not exist")
            );
        }
        a.client.simple_query(sql::FENCE_SETUP).await?;
        assert!(a.notices.borrow().is_empty());
        a.client.simple_query(sql::FENCE_SETUP).await?;
        sleep(Duration::from_millis(1)).await;
        let notices: Vec<(String, String)> = a
            .notices
            .borrow()
            .iter()
            .map(|n| (n.code().code().to_owned(), n.message().to_owned()))
            .collect();
        assert_eq!(
            notices,
            [(
                "42P07".to_owned(),
                "relation \"plexsphere_leader_fence\" already exists, skipping".to_owned()
            )]
        );
        let error = a
            .client
            .simple_query(&sql::FENCE_SETUP.replace(" IF NOT EXISTS", ""))
            .await
            .unwrap_err();
        assert_eq!(code(&error), "42P07");
        assert_eq!(a.row(&sql::fence_check(KEY)).await?, None);
        for want in ["1", "2", "3"] {
            let (names, values) = a.row(&sql::advance_epoch(KEY)).await?.unwrap();
            assert_eq!((names, values), (vec!["epoch".to_owned()], vec![want.to_owned()]));
        }
        assert_eq!(a.values(&sql::fence_check(KEY)).await?, ["3"]);
        assert_eq!(
            a.value(
                "INSERT INTO plexsphere_leader_fence AS f (classid, objid, epoch) VALUES (1886156915, 2, 1) \
                 ON CONFLICT (classid, objid) DO UPDATE SET epoch = f.epoch + 1 RETURNING f.epoch"
            )
            .await?,
            "1",
            "another key"
        );
        assert_eq!(h.fence_epoch(DB, 1_886_156_915, 1), Some(3));
        assert_eq!(h.fence_epoch("other", 1_886_156_915, 1), None);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn fence_epochs_survive_a_crash_and_restart_and_a_failover_to_a_synchronous_standby() {
    let mut sim = sim();
    let pg1 = server(&mut sim, "pg1", ServerConfig::default());
    let pg2 = server(
        &mut sim,
        "pg2",
        ServerConfig::default().with_first_pid(5000),
    );
    pg1.replicate_to(&pg2);
    let lone = server(&mut sim, "pg3", ServerConfig::default());
    let (h1, h2, h3) = (pg1.clone(), pg2.clone(), lone.clone());
    sim.client("app", async move {
        let primary = Primary::new("pg1");
        let a = Session::open(&primary.host(), "a").await?;
        a.client.simple_query(sql::FENCE_SETUP).await?;
        assert_eq!(a.value(&sql::advance_epoch(KEY)).await?, "1");
        assert_eq!(a.value(&sql::advance_epoch(KEY)).await?, "2");
        h1.crash();
        sleep(Duration::from_millis(10)).await;
        h1.restart();
        sleep(Duration::from_millis(10)).await;
        let b = Session::open(&primary.host(), "b").await?;
        assert_eq!(b.values(&sql::fence_check(KEY)).await?, ["2"]);
        assert_eq!(b.value(&sql::advance_epoch(KEY)).await?, "3");
        h1.crash();
        primary.fail_over_to("pg2");
        let c = Session::open(&primary.host(), "c").await?;
        assert_eq!(c.values(&sql::fence_check(KEY)).await?, ["3"]);
        assert_eq!(c.value(&sql::advance_epoch(KEY)).await?, "4");
        assert_eq!(h2.fence_epoch(DB, 1_886_156_915, 1), Some(4));
        // An instance that does not replicate has its own (absent) table.
        let d = Session::open("pg3", "d").await?;
        let error = d
            .client
            .simple_query(&sql::fence_check(KEY))
            .await
            .unwrap_err();
        assert_eq!(code(&error), "42P01");
        assert_eq!(h3.fence_epoch(DB, 1_886_156_915, 1), None);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn a_hot_standby_refuses_fence_writes_with_25006_and_accepts_them_once_promoted() {
    let mut sim = sim();
    let pg1 = server(&mut sim, "pg1", ServerConfig::default());
    let pg2 = server(
        &mut sim,
        "pg2",
        ServerConfig::default()
            .with_first_pid(5000)
            .with_in_recovery(true),
    );
    pg1.replicate_to(&pg2);
    let h2 = pg2.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        a.client.simple_query(sql::FENCE_SETUP).await?;
        assert_eq!(a.value(&sql::advance_epoch(KEY)).await?, "1");
        let s = Session::open("pg2", "s").await?;
        for (query, message) in [
            (
                sql::FENCE_SETUP.to_owned(),
                "cannot execute CREATE TABLE in a read-only transaction",
            ),
            (
                sql::advance_epoch(KEY),
                "cannot execute INSERT in a read-only transaction",
            ),
            (
                sql::fence_check(KEY),
                "cannot execute SELECT FOR SHARE in a read-only transaction",
            ),
        ] {
            let error = s.client.simple_query(&query).await.unwrap_err();
            let db = error.as_db_error().unwrap();
            assert_eq!((db.code().code(), db.message()), ("25006", message));
        }
        assert_eq!(
            s.values(&sql::fence_check(KEY).replace(" FOR SHARE", ""))
                .await?,
            ["1"],
            "a plain read works on the standby"
        );
        h2.promote();
        assert_eq!(s.value(&sql::advance_epoch(KEY)).await?, "2");
        Ok(())
    });
    sim.run().unwrap();
}

// Row locks on the fence row: `SELECT … FOR SHARE` in a transaction block against the epoch
// advance (`ON CONFLICT DO UPDATE`) of another session.

/// The advances of the fence row in the ground-truth log: (pid, epoch, waited).
fn advances(handle: &ServerHandle) -> Vec<(i32, i64, Duration)> {
    handle
        .log()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::EpochAdvanced {
                pid, epoch, waited, ..
            } => Some((pid, epoch, waited)),
            _ => None,
        })
        .collect()
}

/// Sets the fence table up with epoch 1.
async fn fence_at_epoch_one(session: &Session) -> Result<(), tokio_postgres::Error> {
    session.client.simple_query(sql::FENCE_SETUP).await?;
    assert_eq!(session.value(&sql::advance_epoch(KEY)).await?, "1");
    Ok(())
}

#[test]
fn a_fence_check_in_an_open_block_makes_an_advance_wait_until_the_block_commits() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let (pa, pb) = (a.pid().await, b.pid().await);
        fence_at_epoch_one(&a).await?;
        a.client.simple_query("BEGIN").await?;
        assert_eq!(a.values(&sql::fence_check(KEY)).await?, ["1"]);
        let rows: Vec<i32> = h.row_locks().into_iter().map(|(_, pid)| pid).collect();
        assert_eq!(rows, [pa]);
        let b_task = tokio::task::spawn_local(async move {
            let answer = b.value(&sql::advance_epoch(KEY)).await;
            (b, answer, now())
        });
        sleep(Duration::from_millis(100)).await;
        let waiting: Vec<i32> = h.row_waiters().into_iter().map(|(_, pid)| pid).collect();
        assert_eq!(waiting, [pb]);
        assert_eq!(h.fence_epoch(DB, 1_886_156_915, 1), Some(1));
        // A second fence check is granted at once while the advance waits.
        assert_eq!(a.values(&sql::fence_check(KEY)).await?, ["1"]);
        let committed = now();
        a.client.simple_query("COMMIT").await?;
        let (_b, answer, answered) = b_task.await.unwrap();
        assert_eq!(
            answer?, "2",
            "the advance reads the committed epoch after the wait"
        );
        // COMMIT arrives 1 ms after it was sent, the answer 1 ms after that.
        assert_eq!(answered - committed, Duration::from_millis(2));
        assert_eq!(h.row_locks(), vec![]);
        assert_eq!(h.row_waiters(), vec![]);
        let waited = advances(&h)[1];
        assert_eq!((waited.0, waited.1), (pb, 2));
        assert!(waited.2 >= Duration::from_millis(100), "{waited:?}");
        let commits: Vec<(i32, i64, Option<i64>)> = h
            .log()
            .into_iter()
            .filter_map(|e| match e.event {
                Event::FencedCommit {
                    pid,
                    epoch,
                    current,
                    ..
                } => Some((pid, epoch, current)),
                _ => None,
            })
            .collect();
        assert_eq!(commits, [(pa, 1, Some(1))]);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn a_waiting_advance_fails_with_55p03_after_its_lock_timeout_and_the_epoch_stays() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        fence_at_epoch_one(&a).await?;
        a.client.simple_query("BEGIN").await?;
        a.values(&sql::fence_check(KEY)).await?;
        b.client.simple_query("SET lock_timeout = 100").await?;
        let start = now();
        let error = b
            .client
            .simple_query(&sql::advance_epoch(KEY))
            .await
            .unwrap_err();
        let db = error.as_db_error().unwrap();
        assert_eq!(
            (db.code().code(), db.message()),
            ("55P03", "canceling statement due to lock timeout")
        );
        let took = now() - start;
        assert!(took >= Duration::from_millis(100) && took <= Duration::from_millis(103));
        assert_eq!(h.row_waiters(), vec![]);
        a.client.simple_query("COMMIT").await?;
        assert_eq!(h.fence_epoch(DB, 1_886_156_915, 1), Some(1));
        Ok(())
    });
    sim.run().unwrap();
}

/// A fenced block ends with its session: terminated, or ended by the transaction-local
/// `idle_in_transaction_session_timeout` a fenced pass sets (FATAL 25P03).
#[test]
fn the_end_of_the_fenced_session_wakes_the_waiting_advance() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let c = Session::open("pg1", "c").await?;
        let pa = a.pid().await;
        fence_at_epoch_one(&a).await?;
        a.client.simple_query("BEGIN").await?;
        a.values(&sql::fence_check(KEY)).await?;
        let b_task = tokio::task::spawn_local(async move {
            let answer = b.value(&sql::advance_epoch(KEY)).await;
            (b, answer)
        });
        sleep(Duration::from_millis(50)).await;
        assert!(h.terminate_backend(pa));
        let (b, answer) = b_task.await.unwrap();
        assert_eq!(answer?, "2");
        c.client
            .simple_query("BEGIN; SET LOCAL idle_in_transaction_session_timeout = '50ms'")
            .await?;
        assert_eq!(c.values(&sql::fence_check(KEY)).await?, ["2"]);
        let checked = now();
        assert_eq!(b.value(&sql::advance_epoch(KEY)).await?, "3");
        // The check's answer left 1 ms before `checked`; the timeout fires 50 ms after it.
        assert_eq!(now() - checked, Duration::from_millis(49 + 1));
        assert_eq!(c.ended_code().as_deref(), Some("25P03"));
        Ok(())
    });
    sim.run().unwrap();
}

/// As with `pg_advisory_lock`, the waiting backend does not watch its socket: an advance
/// whose client went away still commits once the row is free, then the session ends.
#[test]
fn an_advance_whose_client_went_away_still_commits_once_the_row_is_free() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let b = Session::open("pg1", "b").await?;
        let pb = b.pid().await;
        fence_at_epoch_one(&a).await?;
        a.client.simple_query("BEGIN").await?;
        a.values(&sql::fence_check(KEY)).await?;
        let b_task = tokio::task::spawn_local(async move {
            let _lost = b.client.simple_query(&sql::advance_epoch(KEY)).await;
        });
        sleep(Duration::from_millis(10)).await;
        b_task.abort();
        sleep(Duration::from_millis(100)).await;
        assert!(
            h.session(pb).is_some(),
            "the waiting backend did not notice"
        );
        a.client.simple_query("COMMIT").await?;
        sleep(Duration::from_millis(10)).await;
        assert!(h.session(pb).is_none());
        assert_eq!(h.fence_epoch(DB, 1_886_156_915, 1), Some(2));
        assert_eq!(a.values(&sql::fence_check(KEY)).await?, ["2"]);
        Ok(())
    });
    sim.run().unwrap();
}

// The extended query protocol, for statements without parameters (`server::extended`).

#[test]
fn extended_protocol_queries_return_typed_rows_in_binary() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        let pid = a.pid().await;
        let row = a
            .client
            .query_one(
                "SELECT 1, 'x', pg_backend_pid(), pg_try_advisory_lock(7)",
                &[],
            )
            .await?;
        assert_eq!(row.get::<_, i32>(0), 1);
        assert_eq!(row.get::<_, &str>(1), "x");
        assert_eq!(row.get::<_, i32>(2), pid);
        assert!(row.get::<_, bool>(3));
        assert_eq!(h.session(pid).unwrap().locks, [(LockKey::BigInt(7), 1)]);
        let show = a.client.prepare("SHOW lock_timeout").await?;
        assert_eq!(show.columns()[0].name(), "lock_timeout");
        assert_eq!(a.client.execute("SET lock_timeout = 100", &[]).await?, 0);
        assert_eq!(
            a.client.query_one(&show, &[]).await?.get::<_, &str>(0),
            "100ms"
        );
        assert!(a.client.query("", &[]).await?.is_empty());
        let err = a.client.query("SELECT 1; SELECT 2", &[]).await.unwrap_err();
        assert_eq!(code(&err), "42601");
        // Every Execute of a statement is in the statement log.
        let statements = h.queries().iter().filter(|q| q.pid == pid).count();
        assert_eq!(
            statements,
            1 + 3,
            "the pid query and three Executes of a statement"
        );
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn an_extended_protocol_error_fails_the_block_until_rollback() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    sim.client("app", async move {
        let a = Session::open("pg1", "a").await?;
        a.client.simple_query("BEGIN").await?;
        let err = a.client.query("SELECT nope()", &[]).await.unwrap_err();
        assert_eq!(code(&err), "42883");
        let err = a.client.query("SELECT 1", &[]).await.unwrap_err();
        assert_eq!(code(&err), "25P02");
        a.client.query("ROLLBACK", &[]).await?;
        assert_eq!(
            a.client.query_one("SELECT 2", &[]).await?.get::<_, i32>(0),
            2
        );
        Ok(())
    });
    sim.run().unwrap();
}

/// `fencing::check` runs its statement with `query` (the extended protocol) in the caller's
/// transaction: the fence row stays share-locked until the transaction ends.
#[test]
fn the_adapters_fence_check_runs_unmodified_in_a_transaction() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let mut a = Session::open("pg1", "a").await?;
        let pa = a.pid().await;
        fence_at_epoch_one(&a).await?;
        let transaction = a.client.transaction().await?;
        plexsphere_leader::fencing::check(&transaction, KEY, 1)
            .await
            .unwrap();
        let stale = plexsphere_leader::fencing::check(&transaction, KEY, 2).await;
        assert!(
            matches!(
                stale,
                Err(plexsphere_leader::fencing::FenceError::Stale {
                    epoch: 2,
                    current: 1
                })
            ),
            "{stale:?}"
        );
        let rows: Vec<i32> = h.row_locks().into_iter().map(|(_, pid)| pid).collect();
        assert_eq!(rows, [pa]);
        transaction.commit().await?;
        assert_eq!(h.row_locks(), vec![]);
        let checks = h
            .log()
            .into_iter()
            .filter(|e| {
                matches!(
                    e.event,
                    Event::FenceChecked { .. } | Event::FencedCommit { .. }
                )
            })
            .count();
        assert_eq!(
            checks, 2,
            "one check (the first of the block) and its commit"
        );
        Ok(())
    });
    sim.run().unwrap();
}

/// Every row of `query`, each column's text (`None` for NULL), with the notices it raised
/// (`severity code message`).
async fn rows_and_notices(
    session: &Session,
    query: &str,
) -> Result<(Vec<plexsphere_leader::session::Row>, Vec<String>), tokio_postgres::Error> {
    let messages = session.client.simple_query(query).await?;
    tokio::task::yield_now().await;
    let rows = messages
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_owned))
                    .collect(),
            ),
            _ => None,
        })
        .collect();
    let notices = session
        .notices
        .borrow_mut()
        .drain(..)
        .map(|n| format!("{} {} {}", n.severity(), n.code().code(), n.message()))
        .collect();
    Ok((rows, notices))
}

#[test]
fn shared_locks_coexist_exclude_exclusive_ones_and_unlock_all_frees_both_modes() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let (a, b, c) = (
            Session::open("pg1", "a").await?,
            Session::open("pg1", "b").await?,
            Session::open("pg1", "c").await?,
        );
        let (pa, pb) = (a.pid().await, b.pid().await);
        let shared = "SELECT pg_try_advisory_lock_shared(5, -1)";
        let exclusive = "SELECT pg_try_advisory_lock(5, -1)";
        assert_eq!(a.value(shared).await?, "t");
        assert_eq!(b.value(shared).await?, "t");
        assert_eq!(a.value(shared).await?, "t", "re-entrant");
        assert_eq!(c.value(exclusive).await?, "f", "shared holders exclude it");
        assert_eq!(a.value(exclusive).await?, "f", "b's shared hold excludes a");
        let modes: Vec<(i32, u64, LockMode)> =
            h.locks().iter().map(|l| (l.pid, l.count, l.mode)).collect();
        assert_eq!(
            modes,
            [(pa, 2, LockMode::Shared), (pb, 1, LockMode::Shared)]
        );
        let (rows, notices) =
            rows_and_notices(&c, "SELECT pg_advisory_unlock_shared(5, -1)").await?;
        assert_eq!(rows, [[Some("f".to_owned())]]);
        assert_eq!(
            notices,
            ["WARNING 01000 you don't own a lock of type ShareLock"]
        );
        assert_eq!(
            b.value("SELECT pg_advisory_unlock_shared(5, -1)").await?,
            "t"
        );
        // a's own shared hold does not keep it from the exclusive mode.
        assert_eq!(a.value(exclusive).await?, "t");
        assert_eq!(
            b.value(shared).await?,
            "f",
            "the exclusive hold excludes it"
        );
        assert_eq!(a.value("SELECT pg_advisory_unlock_all()").await?, "");
        assert_eq!(h.locks(), vec![]);
        assert_eq!(c.value(exclusive).await?, "t");
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
    let unlock_all: Vec<(i32, LockMode)> = handle
        .log()
        .into_iter()
        .filter_map(|e| match e.event {
            Event::LockReleased {
                pid,
                reason: ReleaseReason::UnlockAll,
                mode,
                ..
            } => Some((pid, mode)),
            _ => None,
        })
        .collect();
    assert_eq!(
        unlock_all,
        [(1000, LockMode::Exclusive), (1000, LockMode::Shared)]
    );
}

#[test]
fn a_shared_try_behind_a_queued_exclusive_wait_is_refused() {
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let h = handle.clone();
    sim.client("app", async move {
        let (a, b, c) = (
            Session::open("pg1", "a").await?,
            Session::open("pg1", "b").await?,
            Session::open("pg1", "c").await?,
        );
        assert_eq!(a.value("SELECT pg_try_advisory_lock_shared(9)").await?, "t");
        let waiter = tokio::task::spawn_local(async move {
            let answer = b.value("SELECT pg_advisory_lock(9)").await.unwrap();
            (b, answer)
        });
        while h.waiters().is_empty() {
            sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(c.value("SELECT pg_try_advisory_lock_shared(9)").await?, "f");
        assert_eq!(
            a.value("SELECT pg_try_advisory_lock_shared(9)").await?,
            "t",
            "re-entrant"
        );
        assert_eq!(a.value("SELECT pg_advisory_unlock_all()").await?, "");
        let (_b, answer) = waiter.await.unwrap();
        assert_eq!(answer, "");
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
}

#[test]
fn the_lock_table_settings_show_and_cannot_be_changed() {
    let mut sim = sim();
    server(&mut sim, "pg1", ServerConfig::default());
    server(
        &mut sim,
        "pg2",
        ServerConfig::default().with_lock_table(10, 20, 2),
    );
    sim.client("app", async move {
        let settings = "SELECT current_setting('max_locks_per_transaction'), \
                        current_setting('max_connections'), current_setting('max_prepared_transactions')";
        let a = Session::open("pg1", "a").await?;
        assert_eq!(a.values(settings).await?, ["64", "100", "0"]);
        let b = Session::open("pg2", "b").await?;
        assert_eq!(b.values(settings).await?, ["10", "20", "2"]);
        assert_eq!(b.value("SHOW max_connections").await?, "20");
        for set in [
            "SET max_connections = 5",
            "RESET max_locks_per_transaction",
            "SELECT set_config('max_prepared_transactions', '1', false)",
        ] {
            let error = b.client.simple_query(set).await.unwrap_err();
            assert_eq!(code(&error), "55P02", "{set}");
        }
        assert_eq!(b.values(settings).await?, ["10", "20", "2"]);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn the_shard_statements_answer_as_the_adapters_parsers_read_them() {
    use plexsphere_leader::shard_sql;
    use plexsphere_leader::sharded::{MemberId, Shard};

    fn shards(numbers: &[u32]) -> Vec<Shard> {
        numbers.iter().copied().map(Shard::new).collect()
    }
    const CLASS: i32 = -7;
    const COUNT: u32 = 8;
    let mut sim = sim();
    let handle = server(&mut sim, "pg1", ServerConfig::default());
    let standby = server(
        &mut sim,
        "pg2",
        ServerConfig::default().with_in_recovery(true),
    );
    let h = handle.clone();
    sim.client("app", async move {
        let (a, b, c) = (
            Session::open("pg1", "a").await?,
            Session::open("pg1", "b").await?,
            Session::open("pg1", "c").await?,
        );
        let (pa, pb, pc) = (a.pid().await, b.pid().await, c.pid().await);
        let register = |name: &str| shard_sql::register(CLASS, name, 400);
        let (rows, _) = rows_and_notices(&a, &register("alpha")).await?;
        let first = shard_sql::parse_registered(&rows).unwrap();
        assert_eq!(first.backend, MemberId::new(pa));
        assert!(first.granted && !first.in_recovery);
        assert_eq!((first.members, first.lock_capacity), (1, 6400));
        let (rows, _) = rows_and_notices(&b, &register("beta")).await?;
        let second = shard_sql::parse_registered(&rows).unwrap();
        assert_eq!((second.granted, second.members), (true, 2));
        assert_eq!(
            b.values("SELECT current_setting('idle_session_timeout'), current_setting('idle_in_transaction_session_timeout'), current_setting('application_name')")
                .await?,
            ["400ms", "400ms", "beta"]
        );
        assert_eq!(
            b.row(&register("beta")).await?.unwrap().0,
            ["pg_backend_pid", "case", "?column?", "count", "pg_is_in_recovery"]
        );

        let take = |asked: &[u32]| shard_sql::take(CLASS, &shards(asked));
        let (rows, _) = rows_and_notices(&a, &take(&[0, 1, 2])).await?;
        assert_eq!(shard_sql::parse_taken(&rows).unwrap(), shards(&[0, 1, 2]));
        let (rows, _) = rows_and_notices(&b, &take(&[2, 3])).await?;
        assert_eq!(shard_sql::parse_taken(&rows).unwrap(), shards(&[3]));
        // A shard held without the member lock, and locks outside the space.
        c.value("SELECT pg_try_advisory_lock(-7, 6)").await?;
        c.value("SELECT pg_try_advisory_lock(-7, 8)").await?;
        c.value("SELECT pg_try_advisory_lock(-7, -2)").await?;
        c.value("SELECT pg_try_advisory_lock_shared(-7, 5)").await?;

        let (rows, _) = rows_and_notices(&a, &shard_sql::survey(CLASS, COUNT, plexsphere_leader::rank::FloorStep::Off)).await?;
        let read = shard_sql::parse_survey(COUNT, &rows, false).unwrap();
        assert_eq!(read.survey.backend(), MemberId::new(pa));
        assert_eq!(read.survey.members(), [MemberId::new(pa), MemberId::new(pb)]);
        assert_eq!(read.survey.held_by(MemberId::new(pa)), shards(&[0, 1, 2]));
        assert_eq!(read.survey.held_by(MemberId::new(pb)), shards(&[3]));
        assert_eq!(read.survey.holder(Shard::new(6)), Some(MemberId::new(pc)));
        assert_eq!(read.survey.holder(Shard::new(5)), None, "held in shared mode");
        assert_eq!(read.names.get(&MemberId::new(pa)).map(String::as_str), Some("alpha"));
        assert_eq!(read.names.get(&MemberId::new(pc)).map(String::as_str), Some("c"));

        let (rows, notices) =
            rows_and_notices(&a, &shard_sql::unlock(CLASS, &shards(&[1, 3]))).await?;
        assert_eq!(shard_sql::parse_unlocked(&rows).unwrap(), shards(&[3]));
        assert_eq!(
            notices,
            ["WARNING 01000 you don't own a lock of type ExclusiveLock"]
        );
        let (rows, _) = rows_and_notices(&c, &shard_sql::owners(CLASS, COUNT)).await?;
        let owners = shard_sql::parse_owners(&rows).unwrap();
        let summary: Vec<(i32, bool, Vec<Shard>)> = owners
            .iter()
            .map(|o| (o.pid.get(), o.member, o.shards.clone()))
            .collect();
        assert_eq!(
            summary,
            [
                (pa, true, shards(&[0, 2])),
                (pb, true, shards(&[3])),
                (pc, false, shards(&[6]))
            ]
        );

        for s in [&a, &b, &c] {
            assert_eq!(s.value(&shard_sql::unlock_all()).await?, "");
        }
        assert_eq!(h.locks(), vec![]);
        let (rows, _) = rows_and_notices(&a, &shard_sql::survey(CLASS, COUNT, plexsphere_leader::rank::FloorStep::Off)).await?;
        assert_eq!(rows, [[None, None, None, None, Some(pa.to_string())]]);
        let (rows, _) = rows_and_notices(&a, &shard_sql::owners(CLASS, COUNT)).await?;
        assert!(rows.is_empty());

        // A text that begins like a shard statement but is not the adapter's.
        let bent = take(&[1, 2]).replace("{1,2}", "{2,1}");
        let error = a.client.simple_query(&bent).await.unwrap_err();
        assert_eq!(code(&error), "0A000");

        let s = Session::open("pg2", "s").await?;
        let (rows, _) = rows_and_notices(&s, &register("standby")).await?;
        let refused = shard_sql::parse_registered(&rows).unwrap();
        assert!(!refused.granted && refused.in_recovery);
        assert_eq!(
            s.value("SELECT current_setting('application_name')").await?,
            "s"
        );
        Ok(())
    });
    sim.run().unwrap();
    assert_eq!(handle.check_mutual_exclusion(), Ok(()));
    assert_eq!(standby.locks(), vec![]);
}
