#![allow(clippy::unwrap_used)] // tests: a parse failure is the assertion

use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::Message;

use super::*;
use crate::config::ServerConfig;
use crate::log::Event;
use crate::state::Startup;

const GRANT: &str = "SELECT CASE WHEN pg_try_advisory_lock(1886156915, 1) THEN \
                     set_config('idle_session_timeout', '20000', false) IS NOT NULL ELSE false END";

fn server() -> (State, i32, i32) {
    let mut state = State::new(ServerConfig::default());
    state.start(Duration::ZERO);
    let mut open = |name: &str| {
        state.open_session(
            Startup {
                user: name.to_owned(),
                database: "db".to_owned(),
                application_name: String::new(),
            },
            Duration::ZERO,
        )
    };
    let (a, b) = (open("a"), open("b"));
    (state, a, b)
}

/// Runs `query` and renders the reply one line per message.
fn run(state: &mut State, pid: i32, query: &str) -> Vec<String> {
    let Some(Run::Done(reply)) = run_query(state, pid, query, Duration::from_millis(5)) else {
        panic!("{query:?} did not complete");
    };
    let mut buf = reply.into_bytes();
    let mut out = Vec::new();
    while let Some(message) = Message::parse(&mut buf).unwrap() {
        out.push(render(message));
    }
    out
}

fn render(message: Message) -> String {
    match message {
        Message::RowDescription(body) => {
            let fields: Vec<String> = body
                .fields()
                .map(|f| Ok(format!("{}:{}", f.name(), f.type_oid())))
                .collect()
                .unwrap();
            format!("T {}", fields.join(","))
        }
        Message::DataRow(body) => {
            let values: Vec<String> = body
                .ranges()
                .map(|r| {
                    Ok(r.map_or("NULL".to_owned(), |r| {
                        String::from_utf8_lossy(&body.buffer()[r]).into_owned()
                    }))
                })
                .collect()
                .unwrap();
            format!("D {}", values.join(","))
        }
        Message::CommandComplete(body) => format!("C {}", body.tag().unwrap()),
        Message::ReadyForQuery(body) => format!("Z {}", char::from(body.status())),
        Message::EmptyQueryResponse => "I".to_owned(),
        Message::ParameterStatus(body) => {
            format!("S {}={}", body.name().unwrap(), body.value().unwrap())
        }
        Message::ErrorResponse(body) => format!("E {}", code(body.fields())),
        Message::NoticeResponse(body) => format!("N {}", code(body.fields())),
        _ => "?".to_owned(),
    }
}

fn code(mut fields: postgres_protocol::message::backend::ErrorFields<'_>) -> String {
    while let Some(field) = fields.next().unwrap() {
        if field.type_() == b'C' {
            return String::from_utf8_lossy(field.value_bytes()).into_owned();
        }
    }
    String::new()
}

#[test]
fn grant_is_true_then_false_and_bounds_only_the_winner() {
    let (mut state, a, b) = server();
    assert_eq!(
        run(&mut state, a, GRANT),
        ["T case:16", "D t", "C SELECT 1", "Z I"]
    );
    assert_eq!(
        run(&mut state, b, GRANT),
        ["T case:16", "D f", "C SELECT 1", "Z I"]
    );
    assert_eq!(
        state.sessions[&a].gucs.idle_session_timeout,
        Duration::from_secs(20)
    );
    assert_eq!(state.sessions[&b].gucs.idle_session_timeout, Duration::ZERO);
}

#[test]
fn release_if_held_unlocks_only_a_held_lock_and_never_warns() {
    let (mut state, a, b) = server();
    let release = plexsphere_leader::sql::release_if_held(plexsphere_leader::LockKey::DEFAULT);
    assert_eq!(
        run(&mut state, a, "SELECT pg_advisory_lock(1886156915, 1)"),
        ["T pg_advisory_lock:2278", "D ", "C SELECT 1", "Z I"]
    );
    // The two RESETs of the idle bounds come first (the model tags them SET).
    assert_eq!(
        run(&mut state, b, &release),
        ["C SET", "C SET", "T case:16", "D f", "C SELECT 1", "Z I"]
    );
    assert_eq!(
        run(&mut state, a, &release),
        ["C SET", "C SET", "T case:16", "D t", "C SELECT 1", "Z I"]
    );
    assert_eq!(
        run(&mut state, a, &release),
        ["C SET", "C SET", "T case:16", "D f", "C SELECT 1", "Z I"]
    );
}

#[test]
fn select_one_is_an_int4_row() {
    let (mut state, a, _) = server();
    assert_eq!(
        run(&mut state, a, "SELECT 1"),
        ["T ?column?:23", "D 1", "C SELECT 1", "Z I"]
    );
}

#[test]
fn unlock_not_held_is_false_with_warning_between_description_and_row() {
    let (mut state, a, _) = server();
    assert_eq!(
        run(&mut state, a, "SELECT pg_advisory_unlock(1886156915, 1)"),
        [
            "T pg_advisory_unlock:16",
            "N 01000",
            "D f",
            "C SELECT 1",
            "Z I"
        ]
    );
}

#[test]
fn unlock_all_returns_void_and_frees_every_count() {
    let (mut state, a, b) = server();
    run(
        &mut state,
        a,
        "SELECT pg_try_advisory_lock(7); SELECT pg_try_advisory_lock(7)",
    );
    assert_eq!(
        run(&mut state, a, "SELECT pg_advisory_unlock_all()"),
        ["T pg_advisory_unlock_all:2278", "D ", "C SELECT 1", "Z I"]
    );
    assert_eq!(
        run(&mut state, b, "SELECT pg_try_advisory_lock(7)")[1],
        "D t"
    );
}

#[test]
fn int4_pair_out_of_range_is_undefined_function() {
    let (mut state, a, _) = server();
    assert_eq!(
        run(&mut state, a, "SELECT pg_try_advisory_lock(4294967296, 1)"),
        ["E 42883", "Z I"]
    );
}

#[test]
fn empty_query_gets_empty_query_response() {
    let (mut state, a, _) = server();
    assert_eq!(run(&mut state, a, " "), ["I", "Z I"]);
}

#[test]
fn error_in_block_fails_it_until_rollback_which_restores_settings() {
    let (mut state, a, _) = server();
    assert_eq!(run(&mut state, a, "BEGIN"), ["C BEGIN", "Z T"]);
    run(&mut state, a, "SET idle_session_timeout = 1000");
    assert_eq!(run(&mut state, a, "SELECT nope()"), ["E 42883", "Z E"]);
    assert_eq!(run(&mut state, a, "SELECT 1"), ["E 25P02", "Z E"]);
    assert_eq!(run(&mut state, a, "COMMIT"), ["C ROLLBACK", "Z I"]);
    assert_eq!(state.sessions[&a].gucs.idle_session_timeout, Duration::ZERO);
}

#[test]
fn commit_keeps_settings_and_stray_commit_warns() {
    let (mut state, a, _) = server();
    run(&mut state, a, "BEGIN; SET idle_session_timeout TO '2s'");
    assert_eq!(run(&mut state, a, "COMMIT"), ["C COMMIT", "Z I"]);
    assert_eq!(
        run(&mut state, a, "SHOW idle_session_timeout"),
        ["T idle_session_timeout:25", "D 2s", "C SHOW", "Z I"]
    );
    assert_eq!(run(&mut state, a, "COMMIT"), ["N 25P01", "C COMMIT", "Z I"]);
}

#[test]
fn session_lock_taken_in_rolled_back_block_stays_held() {
    let (mut state, a, b) = server();
    run(&mut state, a, "BEGIN");
    run(&mut state, a, "SELECT pg_try_advisory_lock(1886156915, 1)");
    run(&mut state, a, "ROLLBACK");
    assert_eq!(run(&mut state, b, GRANT)[1], "D f");
}

#[test]
fn failed_implicit_transaction_undoes_its_settings() {
    let (mut state, a, _) = server();
    let reply = run(
        &mut state,
        a,
        "SELECT set_config('idle_session_timeout', '5000', false); \
         SELECT pg_try_advisory_lock(4294967296, 1)",
    );
    assert_eq!(
        reply,
        ["T set_config:25", "D 5s", "C SELECT 1", "E 42883", "Z I"]
    );
    assert_eq!(state.sessions[&a].gucs.idle_session_timeout, Duration::ZERO);
}

#[test]
fn application_name_change_is_reported_before_ready_for_query() {
    let (mut state, a, _) = server();
    assert_eq!(
        run(&mut state, a, "SET application_name = 'replica-1'"),
        ["C SET", "S application_name=replica-1", "Z I"]
    );
}

#[test]
fn bad_timeout_value_is_22023_and_changes_nothing() {
    let (mut state, a, _) = server();
    assert_eq!(
        run(&mut state, a, "SET idle_session_timeout = -1"),
        ["E 22023", "Z I"]
    );
    assert_eq!(state.sessions[&a].gucs.idle_session_timeout, Duration::ZERO);
}

#[test]
fn extended_message_fails_open_block() {
    let (mut state, a, _) = server();
    run(&mut state, a, "BEGIN");
    crate::extended::reject(&mut state, a, b'P');
    assert_eq!(state.sessions[&a].transaction, TransactionStatus::Failed);
}

#[test]
fn backend_pid_and_recovery_state() {
    let (mut state, a, _) = server();
    assert_eq!(
        run(&mut state, a, "SELECT pg_backend_pid()")[1],
        format!("D {a}")
    );
    assert_eq!(run(&mut state, a, "SELECT pg_is_in_recovery()")[1], "D f");
}

#[test]
fn a_blocked_statement_resumes_where_it_stopped_without_repeating_side_effects() {
    let (mut state, a, b) = server();
    let wait = "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid()) \
                THEN 'shared' WHEN set_config('lock_timeout', '100', true) IS NULL THEN 'x' \
                WHEN pg_advisory_lock(1886156915, 1) IS NULL THEN 'x' ELSE 'granted' END, \
                pg_try_advisory_lock(5)";
    run(&mut state, a, "SELECT pg_try_advisory_lock(1886156915, 1)");
    let Some(Run::Blocked(blocked)) = run_query(&mut state, b, wait, Duration::ZERO) else {
        panic!("not blocked");
    };
    assert_eq!(
        state.sessions[&b].gucs.lock_timeout,
        Duration::from_millis(100)
    );
    run(&mut state, a, "SELECT pg_advisory_unlock(1886156915, 1)");
    assert!(state.end_wait(b));
    let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::Granted, Duration::ZERO)
    else {
        panic!("not done");
    };
    let mut buf = reply.into_bytes();
    let mut out = Vec::new();
    while let Some(message) = Message::parse(&mut buf).unwrap() {
        out.push(render(message));
    }
    // EXISTS was answered from the journal (false), not re-read (true after the grant).
    assert_eq!(
        out,
        [
            "T case:25,pg_try_advisory_lock:16",
            "D granted,t",
            "C SELECT 1",
            "Z I"
        ]
    );
    assert_eq!(state.sessions[&b].gucs.lock_timeout, Duration::ZERO);
    assert_eq!(
        state
            .locks
            .held_by(b)
            .iter()
            .map(|(_, n)| *n)
            .collect::<Vec<_>>(),
        [1, 1]
    );
}

/// The reply rendered one line per message.
fn lines(reply: Reply) -> Vec<String> {
    let mut buf = reply.into_bytes();
    let mut out = Vec::new();
    while let Some(message) = Message::parse(&mut buf).unwrap() {
        out.push(render(message));
    }
    out
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A server whose fence table exists with epoch 1, and sessions a and b.
fn fenced_server(config: ServerConfig) -> (State, i32, i32) {
    let (mut state, a, b) = server();
    state.config = config;
    run(&mut state, a, plexsphere_leader::sql::FENCE_SETUP);
    assert_eq!(run(&mut state, a, &advance())[1], "D 1");
    (state, a, b)
}

fn advance() -> String {
    plexsphere_leader::sql::advance_epoch(plexsphere_leader::LockKey::DEFAULT)
}

/// The default key's fence check.
const CHECK: &str =
    "SELECT epoch FROM plexsphere_leader_fence WHERE classid = 1886156915 AND objid = 1 FOR SHARE";

#[test]
fn the_check_constant_is_the_default_keys_fence_check() {
    assert_eq!(
        CHECK,
        plexsphere_leader::sql::fence_check(plexsphere_leader::LockKey::DEFAULT)
    );
}

/// The fence events of the log, rendered.
fn fence_log(state: &State) -> Vec<String> {
    state
        .log
        .iter()
        .filter_map(|entry| match &entry.event {
            Event::EpochAdvanced {
                pid, epoch, waited, ..
            } => Some(format!(
                "{:?} advance {pid} {epoch} waited {waited:?}",
                entry.at
            )),
            Event::FenceChecked { pid, epoch, .. } => {
                Some(format!("{:?} check {pid} {epoch}", entry.at))
            }
            Event::FencedCommit {
                pid,
                epoch,
                checked_at,
                current,
                ..
            } => Some(format!(
                "{:?} commit {pid} {epoch} checked {checked_at:?} current {current:?}",
                entry.at
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn an_advance_waits_for_a_fence_check_until_its_block_commits_then_reads_the_new_epoch() {
    let (mut state, a, b) = fenced_server(ServerConfig::default());
    run(&mut state, a, "BEGIN");
    assert_eq!(
        lines(match run_query(&mut state, a, CHECK, ms(10)) {
            Some(Run::Done(reply)) => reply,
            _ => panic!("the check waits"),
        }),
        ["T epoch:20", "D 1", "C SELECT 1", "Z T"]
    );
    let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &advance(), ms(20)) else {
        panic!("the advance did not wait");
    };
    assert_eq!(state.rows.waiters().len(), 1);
    assert!(!state.wait_granted(b));
    let Some(Run::Done(reply)) = run_query(&mut state, a, "COMMIT", ms(50)) else {
        panic!("COMMIT did not complete");
    };
    assert_eq!(lines(reply), ["C COMMIT", "Z I"]);
    assert!(
        state.wait_granted(b),
        "the commit wakes the waiting advance"
    );
    assert!(state.end_wait(b));
    let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::Granted, ms(51)) else {
        panic!("the advance did not complete");
    };
    assert_eq!(lines(reply), ["T epoch:20", "D 2", "C INSERT 0 1", "Z I"]);
    assert_eq!(
        fence_log(&state)[1..],
        [
            format!("10ms check {a} 1"),
            format!("50ms commit {a} 1 checked 10ms current Some(1)"),
            format!("51ms advance {b} 2 waited 31ms"),
        ]
    );
    assert_eq!(state.rows.shared(), vec![]);
}

#[test]
fn a_fence_read_outside_a_block_locks_the_row_only_for_its_statement() {
    let (mut state, a, b) = fenced_server(ServerConfig::default());
    assert_eq!(run(&mut state, a, CHECK)[1], "D 1");
    assert_eq!(state.rows.shared(), vec![]);
    assert_eq!(run(&mut state, b, &advance())[1], "D 2");
    assert_eq!(fence_log(&state).len(), 2, "no fence check outside a block");
}

#[test]
fn a_rolled_back_or_failed_block_releases_its_row_without_a_fenced_commit() {
    let (mut state, a, b) = fenced_server(ServerConfig::default());
    run(&mut state, a, "BEGIN");
    run(&mut state, a, CHECK);
    assert_eq!(run(&mut state, a, "SELECT nope()"), ["E 42883", "Z E"]);
    assert!(
        matches!(
            run_query(&mut state, b, &advance(), ms(5)),
            Some(Run::Blocked(_))
        ),
        "a failed block keeps its row lock"
    );
    assert!(!state.end_wait(b), "b gives up waiting");
    run(&mut state, a, "ROLLBACK");
    assert_eq!(run(&mut state, b, &advance())[1], "D 2");
    let log = fence_log(&state);
    assert!(log.iter().all(|line| !line.contains("commit")), "{log:?}");
}

#[test]
fn the_end_of_a_session_releases_its_row_and_wakes_the_waiting_advance() {
    let (mut state, a, b) = fenced_server(ServerConfig::default());
    run(
        &mut state,
        a,
        "BEGIN; SELECT epoch FROM plexsphere_leader_fence WHERE classid = 1886156915 AND objid = 1 FOR SHARE",
    );
    let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &advance(), ms(5)) else {
        panic!("the advance did not wait");
    };
    state.end_session(a, crate::EndReason::Terminated, ms(9));
    assert!(state.end_wait(b));
    let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::Granted, ms(9)) else {
        panic!("the advance did not complete");
    };
    assert_eq!(lines(reply)[1], "D 2");
}

#[test]
fn a_waiting_advance_whose_lock_timeout_expires_fails_with_55p03_and_changes_nothing() {
    let (mut state, a, b) = fenced_server(ServerConfig::default());
    run(&mut state, a, "BEGIN");
    run(&mut state, a, CHECK);
    let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &advance(), ms(5)) else {
        panic!("the advance did not wait");
    };
    assert!(
        !state.end_wait(b),
        "nothing woke it: the lock timeout ends the wait"
    );
    assert_eq!(state.rows.waiters(), vec![], "it left the queue");
    let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::TimedOut, ms(105)) else {
        panic!("the advance did not fail");
    };
    assert_eq!(lines(reply), ["E 55P03", "Z I"]);
    run(&mut state, a, "COMMIT");
    assert_eq!(run(&mut state, b, CHECK)[1], "D 1");
}

#[test]
fn a_share_lock_is_granted_while_an_advance_waits_which_then_waits_for_both() {
    let (mut state, a, b) = fenced_server(ServerConfig::default());
    let startup = Startup {
        user: "c".to_owned(),
        database: "db".to_owned(),
        application_name: String::new(),
    };
    let c = state.open_session(startup, Duration::ZERO);
    run(&mut state, a, "BEGIN");
    run(&mut state, a, CHECK);
    let Some(Run::Blocked(_)) = run_query(&mut state, b, &advance(), ms(5)) else {
        panic!("the advance did not wait");
    };
    run(&mut state, c, "BEGIN");
    assert_eq!(
        run(&mut state, c, CHECK),
        ["T epoch:20", "D 1", "C SELECT 1", "Z T"]
    );
    run(&mut state, a, "COMMIT");
    assert!(!state.wait_granted(b), "c still shares the row");
    run(&mut state, c, "COMMIT");
    assert!(state.wait_granted(b));
}

#[test]
fn without_row_locks_an_advance_does_not_wait_and_the_commit_shows_the_newer_epoch() {
    let (mut state, a, b) = fenced_server(ServerConfig::default().with_row_locks(false));
    run(&mut state, a, "BEGIN");
    run(&mut state, a, CHECK);
    assert_eq!(run(&mut state, b, &advance())[1], "D 2");
    run(&mut state, a, "COMMIT");
    let log = fence_log(&state);
    assert!(
        log[3].ends_with("commit 1000 1 checked 5ms current Some(2)"),
        "{log:?}"
    );
}

#[test]
fn set_local_lasts_until_the_block_ends_and_warns_outside_one() {
    let (mut state, a, _) = server();
    assert_eq!(
        run(&mut state, a, "SET LOCAL lock_timeout = 100"),
        ["N 25P01", "C SET", "Z I"]
    );
    assert_eq!(state.sessions[&a].gucs.lock_timeout, Duration::ZERO);
    run(
        &mut state,
        a,
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '50ms'",
    );
    assert_eq!(
        state.sessions[&a].gucs.idle_in_transaction_session_timeout,
        ms(50)
    );
    run(
        &mut state,
        a,
        "SET LOCAL idle_in_transaction_session_timeout TO DEFAULT",
    );
    assert_eq!(
        state.sessions[&a].gucs.idle_in_transaction_session_timeout,
        Duration::ZERO
    );
    run(&mut state, a, "SET LOCAL lock_timeout = '1s'");
    run(&mut state, a, "COMMIT");
    assert_eq!(state.sessions[&a].gucs.lock_timeout, Duration::ZERO);
}

/// The lease statements of the default key.
mod lease_statements {
    use plexsphere_leader::LockKey;
    use plexsphere_leader::sql::lease;

    pub(super) fn claim(holder: &str) -> String {
        lease::claim(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            LockKey::DEFAULT,
            holder,
            300,
            50,
        )
    }

    pub(super) fn renew(holder: &str) -> String {
        lease::renew(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            LockKey::DEFAULT,
            holder,
            300,
        )
    }

    pub(super) fn release(holder: &str) -> String {
        lease::release(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            LockKey::DEFAULT,
            holder,
        )
    }

    pub(super) fn who_holds() -> String {
        lease::who_holds(
            plexsphere_leader::sql::lease::DEFAULT_SCHEMA,
            LockKey::DEFAULT,
        )
    }
}

/// Runs `query` for `pid` at `at` ms; the reply rendered, or `blocked`.
fn lease_run(state: &mut State, pid: i32, query: &str, at: u64) -> Vec<String> {
    match run_query(state, pid, query, ms(at)) {
        Some(Run::Done(reply)) => lines(reply),
        Some(Run::Blocked(_)) => vec!["blocked".to_owned()],
        None => vec!["gone".to_owned()],
    }
}

/// A server with the lease setup run, and sessions a and b.
fn lease_server() -> (State, i32, i32) {
    let setup = plexsphere_leader::sql::lease::setup(plexsphere_leader::sql::lease::DEFAULT_SCHEMA);
    set_up_twice(
        &setup,
        &[
            "C CREATE TABLE",
            "C CREATE TABLE",
            "C CREATE TABLE",
            "C CREATE TABLE",
        ],
    )
}

/// A server on which session a ran `setup` and session b ran it again, and both sessions: the
/// setup quiets its notices and takes its transaction lock, then answers `creates`; again, the
/// objects exist and it says nothing of it.
fn set_up_twice(setup: &str, creates: &[&str]) -> (State, i32, i32) {
    let (mut state, a, b) = server();
    let answer = run(&mut state, a, setup);
    let quiet_and_locked = ["C SET", "T pg_advisory_xact_lock:2278", "D ", "C SELECT 1"];
    let expected: Vec<&str> = quiet_and_locked
        .into_iter()
        .chain(creates.iter().copied())
        .chain(["Z I"])
        .collect();
    assert_eq!(answer, expected);
    assert_eq!(run(&mut state, b, setup), answer);
    (state, a, b)
}

/// The lease events of the log, rendered.
fn lease_log(state: &State) -> Vec<String> {
    state
        .log
        .iter()
        .filter_map(|entry| match &entry.event {
            Event::LeaseClaimed {
                pid,
                holder,
                expires,
                ..
            } => Some(format!(
                "{:?} claim {pid} {holder} until {expires:?}",
                entry.at
            )),
            Event::LeaseRenewed {
                pid,
                holder,
                expires,
                ..
            } => Some(format!(
                "{:?} renew {pid} {holder} until {expires:?}",
                entry.at
            )),
            Event::LeaseReleased { pid, holder, .. } => {
                Some(format!("{:?} release {pid} {holder}", entry.at))
            }
            Event::EpochAdvanced { pid, epoch, .. } => {
                Some(format!("{:?} advance {pid} {epoch}", entry.at))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_claim_takes_a_missing_expired_or_own_lease_and_advances_the_fence_row() {
    use lease_statements::{claim, renew, who_holds};
    let (mut state, a, b) = lease_server();
    assert_eq!(
        lease_run(&mut state, a, &claim("ha"), 10),
        [
            "C SET",
            "C SET",
            "T pg_advisory_xact_lock:2278",
            "D ",
            "C SELECT 1",
            "T epoch:20,schemas:25",
            "D 1,NULL",
            "C SELECT 1",
            "Z I"
        ]
    );
    assert_eq!(
        lease_run(&mut state, b, &claim("hb"), 20)[5..],
        ["T epoch:20,schemas:25", "D NULL,NULL", "C SELECT 1", "Z I"],
        "a's lease runs until 310 ms"
    );
    assert_eq!(
        lease_run(&mut state, a, &claim("ha"), 30)[6],
        "D 2,NULL",
        "its own"
    );
    assert_eq!(
        lease_run(&mut state, b, &renew("hb"), 40)[1..3],
        ["C UPDATE 0".to_owned(), "Z I".to_owned()][..]
    );
    assert_eq!(
        lease_run(&mut state, b, &claim("hb"), 329)[6],
        "D NULL,NULL"
    );
    assert_eq!(
        lease_run(&mut state, b, &claim("hb"), 330)[6],
        "D 3,NULL",
        "expired at 330 ms"
    );
    assert_eq!(
        lease_run(&mut state, a, &renew("ha"), 340),
        ["T ?column?:23", "C UPDATE 0", "Z I"],
        "the row is b's"
    );
    let who = lease_run(&mut state, a, &who_holds(), 350);
    assert_eq!(who[0], "T holder:25,epoch:20,date_part:701,?column?:16");
    assert_eq!(who[1], "D hb,3,1767225600.63,t");
    assert_eq!(
        lease_log(&state),
        [
            format!("10ms claim {a} ha until 310ms"),
            format!("10ms advance {a} 1"),
            format!("30ms claim {a} ha until 330ms"),
            format!("30ms advance {a} 2"),
            format!("330ms claim {b} hb until 630ms"),
            format!("330ms advance {b} 3"),
        ]
    );
}

#[test]
fn a_renewal_extends_an_unexpired_lease_from_any_session_and_never_revives_an_expired_one() {
    use lease_statements::{claim, release, renew, who_holds};
    let (mut state, a, b) = lease_server();
    assert_eq!(
        lease_run(&mut state, a, &who_holds(), 1),
        [
            "T holder:25,epoch:20,date_part:701,?column?:16",
            "C SELECT 0",
            "Z I"
        ]
    );
    lease_run(&mut state, a, &claim("ha"), 10);
    assert_eq!(
        lease_run(&mut state, b, &renew("ha"), 200),
        ["T ?column?:23", "D 1", "C UPDATE 1", "Z I"],
        "the holder's unexpired row (until 310 ms), on any session"
    );
    assert_eq!(
        lease_run(&mut state, b, &release("hb"), 410)[1],
        "C UPDATE 0"
    );
    assert_eq!(lease_run(&mut state, a, &release("ha"), 420)[1], "D 1");
    assert_eq!(
        lease_run(&mut state, a, &release("ha"), 421)[1],
        "C UPDATE 0",
        "expired"
    );
    assert_eq!(
        lease_run(&mut state, b, &renew("ha"), 430)[1],
        "C UPDATE 0",
        "a renewal arriving after the release does not revive the lease"
    );
    assert_eq!(
        lease_run(&mut state, b, &who_holds(), 432)[1],
        "D ha,1,1767225600.42,f"
    );
    assert_eq!(lease_run(&mut state, b, &claim("hb"), 432)[6], "D 2,NULL");
    assert_eq!(
        lease_log(&state)[2..4],
        [
            format!("200ms renew {b} ha until 500ms"),
            format!("420ms release {a} ha")
        ]
    );
}

#[test]
fn a_claim_waits_for_a_fenced_transaction_writing_nothing_and_its_lock_timeout_fails_it() {
    use lease_statements::{claim, who_holds};
    let (mut state, a, b) = lease_server();
    lease_run(&mut state, a, &claim("ha"), 10);
    run(&mut state, a, "BEGIN");
    lease_run(&mut state, a, CHECK, 20);
    let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &claim("hb"), ms(400)) else {
        panic!("the claim did not wait for the fence row");
    };
    assert_eq!(
        lease_run(&mut state, a, &who_holds(), 401)[1],
        "D ha,1,1767225600.31,f"
    );
    assert!(!state.end_wait(b));
    let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::TimedOut, ms(450)) else {
        panic!("the claim did not fail");
    };
    // The settings and the transaction lock answered before the claim waited.
    assert_eq!(
        lines(reply),
        [
            "C SET",
            "C SET",
            "T pg_advisory_xact_lock:2278",
            "D ",
            "C SELECT 1",
            "E 55P03",
            "Z I"
        ]
    );
    assert_eq!(
        lease_run(&mut state, b, &who_holds(), 451)[1],
        "D ha,1,1767225600.31,f"
    );
    let Some(Run::Blocked(blocked)) = run_query(&mut state, b, &claim("hb"), ms(460)) else {
        panic!("the claim did not wait for the fence row");
    };
    run(&mut state, a, "COMMIT");
    assert!(state.end_wait(b), "the commit wakes the claim");
    let Some(Run::Done(reply)) = resume(&mut state, b, blocked, WaitEnd::Granted, ms(470)) else {
        panic!("the claim did not complete");
    };
    assert_eq!(
        lines(reply)[5..8],
        ["T epoch:20,schemas:25", "D 2,NULL", "C SELECT 1"]
    );
    assert_eq!(
        lease_log(&state)[2..],
        [
            format!("470ms claim {b} hb until 760ms"),
            format!("470ms advance {b} 2"),
        ],
        "now() is the claim's start, 460 ms"
    );
}

#[test]
fn lease_statements_need_the_tables_and_a_writable_server() {
    use lease_statements::{claim, renew, who_holds};
    let (mut state, a, _b) = server();
    assert_eq!(
        lease_run(&mut state, a, &claim("ha"), 1),
        [
            "C SET",
            "C SET",
            "T pg_advisory_xact_lock:2278",
            "D ",
            "C SELECT 1",
            "E 42P01",
            "Z I"
        ]
    );
    assert_eq!(
        lease_run(&mut state, a, &who_holds(), 1),
        ["E 42P01", "Z I"]
    );
    run(
        &mut state,
        a,
        &plexsphere_leader::sql::lease::setup(plexsphere_leader::sql::lease::DEFAULT_SCHEMA),
    );
    state.in_recovery = true;
    assert_eq!(
        lease_run(&mut state, a, &renew("ha"), 2),
        ["E 25006", "Z I"]
    );
    assert_eq!(lease_run(&mut state, a, &who_holds(), 2)[1], "C SELECT 0");
}

/// The statements of a lease shard space, as the adapter builds them (space 5, in the default
/// schema, a TTL of 300 ms).
mod shard_lease_statements {
    use plexsphere_leader::shard_sql::lease;
    use plexsphere_leader::sharded::{MemberId, Shard};

    const SCHEMA: &str = plexsphere_leader::sql::lease::DEFAULT_SCHEMA;

    pub(super) fn setup() -> String {
        lease::setup(SCHEMA)
    }
    pub(super) fn register(holder: &str) -> String {
        lease::register(
            SCHEMA,
            5,
            holder,
            300,
            plexsphere_leader::rank::FloorStep::Off,
        )
    }
    pub(super) fn renew(member: i32, holder: &str) -> String {
        lease::renew(SCHEMA, 5, MemberId::new(member), holder, 300)
    }
    pub(super) fn survey() -> String {
        lease::survey(SCHEMA, 5, 4, plexsphere_leader::rank::FloorStep::Off)
    }
    fn shards(list: &[u32]) -> Vec<Shard> {
        list.iter().copied().map(Shard::new).collect()
    }
    pub(super) fn take(member: i32, list: &[u32]) -> String {
        lease::take(SCHEMA, 5, MemberId::new(member), &shards(list), 50)
    }
    pub(super) fn release(member: i32, list: &[u32]) -> String {
        lease::release(SCHEMA, 5, MemberId::new(member), &shards(list))
    }
    pub(super) fn leave(member: i32) -> String {
        lease::leave(SCHEMA, 5, MemberId::new(member))
    }
}

/// The data rows of a reply but the transaction lock's `void`, asserting it had no error.
fn data_rows(lines: &[String]) -> Vec<String> {
    assert!(!lines.iter().any(|l| l.starts_with("E ")), "{lines:?}");
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("D ").filter(|row| !row.is_empty()))
        .map(str::to_owned)
        .collect()
}

/// A server with a lease shard space's setup run (twice), and sessions a and b: the member
/// sequence, the member, owner, fence and version floor tables.
fn shard_lease_server() -> (State, i32, i32) {
    let creates = [
        "C CREATE SEQUENCE",
        "C CREATE TABLE",
        "C CREATE TABLE",
        "C CREATE TABLE",
        "C CREATE TABLE",
    ];
    set_up_twice(&shard_lease_statements::setup(), &creates)
}

#[test]
fn a_lease_shard_space_registers_renews_takes_releases_and_leaves_as_postgresql_does() {
    use shard_lease_statements::{leave, register, release, renew, survey, take};
    let (mut state, a, b) = shard_lease_server();
    let reply = lease_run(&mut state, a, &register("ha"), 10);
    assert_eq!(
        reply,
        [
            "C SET",
            "T member:23,count:20",
            "D 1,0",
            "C INSERT 0 1",
            "Z I"
        ]
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, b, &register("hb"), 20)),
        ["2,1"]
    );
    // A take owns the free shards asked and advances their fence rows.
    let reply = lease_run(&mut state, a, &take(1, &[0, 1]), 30);
    assert_eq!(
        reply[..5],
        [
            "C SET",
            "C SET",
            "T pg_advisory_xact_lock:2278",
            "D ",
            "C SELECT 1"
        ]
    );
    assert_eq!(
        reply[5..],
        [
            "C UPDATE 0",
            "T count:20,string_agg:25",
            "D 1,0:1,1:1",
            "C SELECT 1",
            "Z I"
        ]
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, b, &take(2, &[1, 2, 3]), 40)),
        ["1,2:1,3:1"],
        "shard 1 is a live member's"
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, a, &survey(), 50)),
        ["1,ha,0,1", "2,hb,2,3"]
    );
    // A renewal by another holder, or of another member, renews nothing.
    assert_eq!(
        data_rows(&lease_run(&mut state, a, &renew(1, "hb"), 60)),
        ["0,1,2"]
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, a, &renew(1, "ha"), 100)),
        ["1,1,2"]
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, b, &release(2, &[1, 3]), 110)),
        ["3"]
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, b, &leave(2), 120)),
        ["1"],
        "its last shard freed, its row deleted"
    );
    assert_eq!(
        lease_run(&mut state, b, &leave(2), 121)[..3],
        ["C UPDATE 0", "T ?column?:23", "C DELETE 0"]
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, a, &survey(), 130)),
        ["1,ha,0,1"]
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, a, &take(1, &[2, 3]), 140)),
        ["1,2:2,3:2"],
        "the epochs go on from the earlier owner's"
    );
}

#[test]
fn a_take_reaps_expired_members_and_a_renewal_after_the_reap_renews_nothing() {
    use shard_lease_statements::{register, renew, survey, take};
    let (mut state, a, b) = shard_lease_server();
    lease_run(&mut state, a, &register("ha"), 10);
    lease_run(&mut state, b, &register("hb"), 10);
    assert_eq!(
        data_rows(&lease_run(&mut state, a, &take(1, &[0, 1]), 20)),
        ["1,0:1,1:1"]
    );
    // b renews every 100 ms; a stops renewing at 10 ms: its lease ends at 310 ms.
    for at in [110, 210, 300] {
        assert_eq!(
            data_rows(&lease_run(&mut state, b, &renew(2, "hb"), at)),
            ["1,1,2"]
        );
    }
    assert_eq!(
        data_rows(&lease_run(&mut state, b, &take(2, &[0, 1]), 309)),
        ["1,NULL"],
        "a lives until 310 ms: nothing reaped, nothing taken"
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, b, &renew(2, "hb"), 310)),
        ["1,2"]
    );
    assert_eq!(
        lease_run(&mut state, b, &take(2, &[0, 1]), 311)[5..7],
        ["C UPDATE 2", "T count:20,string_agg:25"],
        "a reaped, its two shards freed"
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, b, &survey(), 312)),
        ["2,hb,0,1"]
    );
    // a's renewal arrives after the reap (its client sent it before its lease ended): no row.
    assert_eq!(
        data_rows(&lease_run(&mut state, a, &renew(1, "ha"), 313)),
        ["0,2"]
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, a, &take(1, &[2]), 314)),
        ["0,NULL"],
        "a dead member takes nothing"
    );
    let reaped = state.log.iter().any(|entry| {
        entry.event
            == Event::MemberGone {
                pid: b,
                class: 5,
                member: 1,
                reaped: true,
            }
    });
    assert!(reaped);
}

#[test]
fn committed_shard_leases_survive_a_crash_and_a_missing_table_is_42p01() {
    use shard_lease_statements::{register, survey, take};
    let (mut state, a, _) = server();
    assert_eq!(
        lease_run(&mut state, a, &register("ha"), 5)[1],
        "E 42P01",
        "before the setup"
    );
    let (mut state, a, _) = shard_lease_server();
    lease_run(&mut state, a, &register("ha"), 10);
    lease_run(&mut state, a, &take(1, &[3]), 20);
    state.crash(ms(30));
    state.start(ms(40));
    let c = state.open_session(
        Startup {
            user: "c".to_owned(),
            database: "db".to_owned(),
            application_name: String::new(),
        },
        ms(40),
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, c, &survey(), 50)),
        ["1,ha,3"]
    );
    assert_eq!(
        data_rows(&lease_run(&mut state, c, &register("hc"), 60)),
        ["2,1"],
        "the sequence goes on"
    );
}

#[test]
fn the_unlogged_candidate_rows_go_with_a_crash_and_are_never_on_a_standby() {
    use plexsphere_leader::rank::{Candidate, Rank, Version};
    use plexsphere_leader::sql::candidacy;
    let table = candidacy::candidate_table(plexsphere_leader::sql::lease::DEFAULT_SCHEMA);
    let key = plexsphere_leader::LockKey::DEFAULT;
    let mine = Candidate {
        rank: Rank::of_version(Version::new(2, 0, 0)),
        live_for: ms(0),
    };
    let publish = |holder: &str| {
        candidacy::survey_rows(
            &table,
            key,
            holder,
            Some(mine),
            (
                candidacy::FLOOR_TABLE,
                plexsphere_leader::rank::FloorStep::Off,
            ),
        )
    };
    let (mut state, a, b) = lease_server();
    lease_run(&mut state, a, &publish("A"), 10);
    assert_eq!(
        data_rows(&lease_run(&mut state, b, &publish("B"), 20)),
        ["~706c7873.1 0 2.0.0 1767225600010 0 A,1767225600020"]
    );
    state.crash(ms(30));
    state.start(ms(40));
    let c = state.open_session(
        Startup {
            user: "c".to_owned(),
            database: "db".to_owned(),
            application_name: String::new(),
        },
        ms(40),
    );
    let read = candidacy::survey_rows(
        &table,
        key,
        "C",
        None,
        (
            candidacy::FLOOR_TABLE,
            plexsphere_leader::rank::FloorStep::Off,
        ),
    );
    assert!(data_rows(&lease_run(&mut state, c, &read, 50)).is_empty());
    state.in_recovery = true;
    assert_eq!(lease_run(&mut state, c, &read, 60)[0], "E 0A000");
}
