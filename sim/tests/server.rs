//! The simulated PostgreSQL server, driven by an unmodified `tokio_postgres` client inside
//! turmoil.
#![allow(clippy::unwrap_used)] // tests: an unexpected failure is the assertion
#![allow(missing_docs)] // test functions

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::poll_fn;
use plexsphere_leader_sim::server::{
    ConnectError, EndReason, Event, LockId, LockKey, Primary, ReleaseReason, ServerConfig,
    ServerHandle, SimPostgres, TransactionStatus, connect_with,
};
use tokio::task::JoinHandle;
use tokio::time::sleep;
use tokio_postgres::error::DbError;
use tokio_postgres::{Client, Config, SimpleQueryMessage};
use turmoil::{Builder, Sim};

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
fn unsupported_statements_and_extended_protocol_fail_but_session_goes_on() {
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
        let err = a.client.query("SELECT 1", &[]).await.unwrap_err();
        assert_eq!(code(&err), "0A000");
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
        },
        Event::LockReleased {
            pid: 1000,
            lock: lock.clone(),
            remaining: 0,
            reason: ReleaseReason::Unlock,
        },
        Event::LockGranted {
            pid: 1001,
            lock: lock.clone(),
            count: 1,
        },
        Event::LockReleased {
            pid: 1001,
            lock,
            remaining: 0,
            reason: ReleaseReason::SessionEnd(EndReason::ClientTerminate),
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
    fn run_once() -> Vec<plexsphere_leader_sim::server::LogEntry> {
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
