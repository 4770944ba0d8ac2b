//! `FaultProxy`: forward, delay, blackhole, reset, close and refuse, against the real local
//! server (for what a PostgreSQL client sees) and a local echo server (for exact TCP effects).
#![allow(clippy::unwrap_used)] // Tests: a failed unwrap is a failed test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use plexsphere_leader_tests::{Direction, FaultProxy, Mode, TestDb, connect};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, timeout};

const SHORT: Duration = Duration::from_millis(500);
const LONG: Duration = Duration::from_secs(5);

/// An echo server that counts the ends of stream it has read.
async fn echo_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let eofs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&eofs);
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                loop {
                    match socket.read(&mut buf).await {
                        Ok(0) => {
                            counter.fetch_add(1, Ordering::SeqCst);
                            let _ = socket.shutdown().await;
                            return;
                        }
                        Ok(n) => {
                            if socket.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            });
        }
    });
    (addr, eofs)
}

async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

async fn wait_sessions(db: &TestDb, prefix: &str, n: usize) -> bool {
    let deadline = Instant::now() + LONG;
    loop {
        if db.session_count(prefix).await.unwrap() == n {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn forward_carries_a_real_postgres_connection() {
    let db = TestDb::create("proxy_forward").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let config = proxy.pg_config(&db.config_with_app_name("proxied"));
    let client = connect(&config).await.unwrap();
    let row = client
        .query_one("SELECT current_database(), 40 + 2", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), db.name());
    assert_eq!(row.get::<_, i32>(1), 42);
    proxy.wait_open_count(1, LONG).await.unwrap();
    assert_eq!(proxy.accepted_count(), 1);

    let pool = plexsphere_leader_tests::pool_for(config, 2).unwrap();
    pool.get()
        .await
        .unwrap()
        .simple_query("SELECT 1")
        .await
        .unwrap();
    assert_eq!(proxy.accepted_count(), 2);

    drop(client);
    drop(pool);
    proxy.wait_open_count(0, LONG).await.unwrap();
    db.cleanup().await.unwrap();
}

/// Blackhole: the query is neither answered nor refused, both sockets stay open, and the
/// server's session sits idle (it never saw the query). Back in `Forward`, the dropped query
/// is gone for good: tokio-postgres pairs each answer with the oldest request still waiting,
/// so the next query's answer is consumed by the abandoned one and the next query hangs too.
/// The session stays one answer behind forever; a client must close it (as the elector does
/// after an unanswered ping).
#[tokio::test]
async fn blackhole_holds_queries_and_keeps_the_server_session_open() {
    let db = TestDb::create("proxy_blackhole").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let client = connect(&proxy.pg_config(&db.config_with_app_name("proxied")))
        .await
        .unwrap();
    client.simple_query("SELECT 1").await.unwrap();

    proxy.set_both(Mode::Blackhole);
    assert!(
        timeout(SHORT, client.simple_query("SELECT 1"))
            .await
            .is_err()
    );
    assert!(!client.is_closed(), "no FIN, no RST reached the client");
    assert!(proxy.dropped_bytes(Direction::ClientToServer) > 0);
    assert_eq!(proxy.open_count(), 1);
    let sessions = db.sessions_of("proxied").await.unwrap();
    assert_eq!(sessions.len(), 1, "the server still has the session");
    assert_eq!(
        sessions[0].state.as_deref(),
        Some("idle"),
        "it never saw the query"
    );

    proxy.set_both(Mode::Forward);
    assert!(
        timeout(SHORT, client.simple_query("SELECT 2"))
            .await
            .is_err(),
        "desynchronised: the answer went to the abandoned query"
    );
    assert!(!client.is_closed());
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn blackhole_while_idle_then_forward_resumes_cleanly() {
    let db = TestDb::create("proxy_idle_blackhole").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let client = connect(&proxy.pg_config(&db.config())).await.unwrap();
    proxy.set_both(Mode::Blackhole);
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_both(Mode::Forward);
    let rows = client.simple_query("SELECT 1").await.unwrap();
    assert!(!rows.is_empty(), "nothing was dropped, nothing is lost");
    assert_eq!(proxy.dropped_bytes(Direction::ClientToServer), 0);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn reset_all_makes_the_client_error_and_ends_the_server_session() {
    let db = TestDb::create("proxy_reset").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let client = connect(&proxy.pg_config(&db.config_with_app_name("proxied")))
        .await
        .unwrap();
    client.simple_query("SELECT 1").await.unwrap();
    assert!(wait_sessions(&db, "proxied", 1).await);

    assert_eq!(proxy.reset_all().await, 1);
    let answer = timeout(LONG, client.simple_query("SELECT 1")).await;
    assert!(
        matches!(answer, Ok(Err(_))),
        "an error, not a hang: {answer:?}"
    );
    assert!(client.is_closed());
    assert_eq!(proxy.open_count(), 0);
    assert!(
        wait_sessions(&db, "proxied", 0).await,
        "the server saw the RST"
    );
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn delay_holds_bytes_and_forward_releases_them() {
    let db = TestDb::create("proxy_delay").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let client = connect(&proxy.pg_config(&db.config())).await.unwrap();

    proxy.set_mode(Direction::ServerToClient, Mode::Delay(SHORT));
    let started = Instant::now();
    client.simple_query("SELECT 1").await.unwrap();
    assert!(started.elapsed() >= SHORT, "took {:?}", started.elapsed());

    proxy.set_mode(
        Direction::ServerToClient,
        Mode::Delay(Duration::from_secs(30)),
    );
    let started = Instant::now();
    let query = client.simple_query("SELECT 1");
    let release = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        proxy.set_mode(Direction::ServerToClient, Mode::Forward);
    };
    let (rows, ()) = tokio::join!(timeout(LONG, query), release);
    rows.unwrap().unwrap();
    assert!(started.elapsed() < LONG);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn reset_all_sends_rst_and_close_all_sends_fin() {
    let (echo, eofs) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();

    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    a.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    a.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    assert_eq!(proxy.reset_all().await, 1);
    let err = a.read(&mut buf).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);

    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.wait_open_count(1, LONG).await.unwrap();
    assert_eq!(proxy.close_all().await, 1);
    assert_eq!(
        timeout(LONG, b.read(&mut buf)).await.unwrap().unwrap(),
        0,
        "FIN"
    );
    assert!(
        wait_until(LONG, || eofs.load(Ordering::SeqCst) >= 1).await,
        "the server got a FIN too"
    );
    assert_eq!(proxy.accepted_count(), 2);
}

#[tokio::test]
async fn blackhole_drops_bytes_for_good_and_holds_the_fin_back() {
    let (echo, eofs) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();

    proxy.set_mode(Direction::ClientToServer, Mode::Blackhole);
    s.write_all(b"lost").await.unwrap();
    assert!(wait_until(LONG, || proxy.dropped_bytes(Direction::ClientToServer) == 4).await);
    proxy.set_mode(Direction::ClientToServer, Mode::Forward);
    s.write_all(b"kept").await.unwrap();
    let mut buf = [0u8; 4];
    timeout(LONG, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        &buf, b"kept",
        "the blackholed bytes are gone, later ones arrive"
    );

    proxy.set_mode(Direction::ClientToServer, Mode::Blackhole);
    s.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(eofs.load(Ordering::SeqCst), 0, "no FIN while blackholed");
    assert_eq!(proxy.open_count(), 1);
    proxy.set_mode(Direction::ClientToServer, Mode::Forward);
    assert!(wait_until(LONG, || eofs.load(Ordering::SeqCst) == 1).await);
    assert_eq!(timeout(LONG, s.read(&mut buf)).await.unwrap().unwrap(), 0);
    proxy.wait_open_count(0, LONG).await.unwrap();
}

#[tokio::test]
async fn refused_connections_are_reset_until_refusing_stops() {
    let db = TestDb::create("proxy_refuse").await.unwrap();
    let proxy = FaultProxy::in_front_of(&db.config()).await.unwrap();
    let config = proxy.pg_config(&db.config());
    let existing = connect(&config).await.unwrap();

    proxy.set_refuse_new(true);
    assert!(connect(&config).await.is_err());
    let mut raw = TcpStream::connect(proxy.addr()).await.unwrap();
    let mut buf = [0u8; 1];
    let err = timeout(LONG, raw.read(&mut buf))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    assert_eq!(proxy.refused_count(), 2);
    existing.simple_query("SELECT 1").await.unwrap();

    proxy.set_refuse_new(false);
    connect(&config).await.unwrap();
    assert_eq!(proxy.accepted_count(), 2);
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn dropping_the_proxy_ends_its_connections() {
    let (echo, _eofs) = echo_server().await;
    let proxy = FaultProxy::start(echo).await.unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    proxy.wait_open_count(1, LONG).await.unwrap();
    let addr = proxy.addr();
    drop(proxy);
    let mut buf = [0u8; 1];
    let read = timeout(LONG, s.read(&mut buf)).await.unwrap();
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "no longer listening"
    );
}
