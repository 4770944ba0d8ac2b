//! Small contracts: getters, texts, and the connection each action and event names.

use super::*;

// ---- small contracts ----

#[test]
fn getters_and_texts_say_what_they_stand_for() {
    let f = Fixture::new();
    let other = CheckInterval::new(Duration::from_millis(200)).unwrap();
    assert_eq!(Election::<&str>::new(other).interval(), other);
    assert_eq!(
        AlreadyRunning.to_string(),
        "the election is already running"
    );
    assert_eq!(
        TermEndCause::Lost(LossReason::CheckTimedOut).to_string(),
        "leadership lost: the check did not answer in time"
    );
    assert_eq!(TermEndCause::Stopped.to_string(), "election stopped");
    assert_eq!(ConnId::new(7).to_string(), "conn#7");
    assert_eq!((ConnId::new(7).get(), TermId::new(9).get()), (7, 9));
    assert_eq!(TermId::new(7).to_string(), "7");
    assert!(format!("{:?}", f.election).contains("Idle"));
}

#[test]
fn actions_and_events_name_their_connection() {
    let with_conn: Vec<A> = vec![
        A::AcquireConnection { conn: C2 },
        A::TryLock { conn: C2 },
        A::ReturnToPool { conn: C2 },
        A::Hijack {
            conn: C2,
            backend_pid: PID,
        },
        A::Ping {
            conn: C2,
            backend_pid: PID,
        },
        A::Unlock { conn: C2 },
        A::CloseConnection { conn: C2 },
    ];
    assert!(with_conn.iter().all(|a| a.conn() == Some(C2)));
    let without: Vec<A> = vec![
        A::BeginTerm {
            term: T1,
            epoch: None,
        },
        A::EndTerm {
            term: T1,
            cause: TermEndCause::Stopped,
        },
        log(LogKind::LockReleased, None, None),
        A::Finish,
    ];
    assert!(without.iter().all(|a| a.conn().is_none()));
    let events: Vec<E> = vec![
        E::ConnectionAcquired { conn: C2 },
        E::AcquireFailed {
            conn: C2,
            cause: "x",
        },
        E::LockGranted {
            conn: C2,
            backend_pid: PID,
        },
        E::LockRefused { conn: C2 },
        E::LockQueryFailed {
            conn: C2,
            cause: "x",
        },
        E::PingAnswered {
            conn: C2,
            found: LockCheck::holding(PID),
        },
        E::PingFailed {
            conn: C2,
            cause: "x",
        },
        E::UnlockDone {
            conn: C2,
            released: true,
        },
        E::UnlockFailed {
            conn: C2,
            cause: "x",
        },
    ];
    assert!(events.iter().all(|e| e.conn() == Some(C2)));
    assert!(
        [Control::Cancelled, Control::Panicked, Control::Dropped]
            .into_iter()
            .all(|control| E::Control(control).conn().is_none())
    );
}

#[test]
fn causes_render_for_the_log() {
    let timed_out: Cause<&str> = Cause::TimedOut(Duration::from_millis(200));
    assert_eq!(timed_out.to_string(), "no answer within 200ms");
    assert!(
        Cause::<&str>::LockNotHeld
            .to_string()
            .contains("did not hold the lock")
    );
    let record = LogRecord {
        kind: LogKind::LockReleased,
        term: Some(T1),
        cause: None::<Cause<&str>>,
    };
    assert_eq!(
        record.to_string(),
        "leader: released background leader lock"
    );
    assert_eq!(record.level(), Level::Info);
    assert_eq!(
        record.lease_text(),
        "leader: released background leader lease"
    );
    let lost = LogRecord {
        kind: LogKind::LeadershipLost,
        term: Some(T1),
        cause: Some(Cause::<&str>::TimedOut(Duration::from_millis(200))),
    };
    assert_eq!(
        lost.lease_text(),
        "leader: lost background leader lease: no answer within 200ms"
    );
    // The spec's own texts stay as they are.
    for kind in [LogKind::AcquireFailed, LogKind::AbandonedAfterPanic] {
        assert_eq!(kind.lease_message(), kind.message());
    }
    for kind in [
        LogKind::LeadershipAcquired,
        LogKind::LeadershipLost,
        LogKind::LockReleased,
        LogKind::ResignReleased,
        LogKind::YieldReleased,
        LogKind::ReleaseFailed,
        LogKind::AbandonedAfterDrop,
    ] {
        assert!(kind.lease_message().contains("lease"), "{kind:?}");
        assert!(!kind.lease_message().contains("lock"), "{kind:?}");
    }
}
