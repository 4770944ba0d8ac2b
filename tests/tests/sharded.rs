//! Sharded leadership against the real server: replicas split a space evenly on one lock session
//! each, a join and a leave move about the share of one replica, a terminated session demotes
//! every shard it held at once, a handover waits for the shard's work, and a lock table too small
//! for the space fails the run with a typed error. Every test has its own database.
//!
//! Bounds are asserted with the margins of `support` (I = 200 ms, MARGIN = 5 s): a handover or
//! a failover within one interval plus the margin, a balance within a few intervals plus it.
//! The split, the join, the graceful stop, the terminated session, the handover under work and
//! resign/eligibility run on both backends (deadpool and sqlx: `<test>::deadpool`,
//! `<test>::sqlx`).
// The scenarios run on both backends are plain functions called from the tests of
// `on_both_backends!`; clippy's allowance for `unwrap` in tests does not see them.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use plexsphere_leader::sharded::{ShardConfig, ShardedElector};
use plexsphere_leader::{RunError, TermEndCause};
use plexsphere_leader_tests::{Backend, TestDb};
use support::{I, MARGIN, STARTUP, wait_for, wait_for_async};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// One replica of a sharded service.
struct Member {
    elector: ShardedElector,
    shutdown: CancellationToken,
    run: JoinHandle<Result<(), RunError>>,
}

impl Member {
    /// A member on a pool of `backend`.
    fn spawn_on(db: &TestDb, backend: Backend, shards: u32, name: &str) -> Self {
        let pool = db.backend_pool(backend, name, 4).expect("pool");
        Self::spawn_with(db, name, pool.shard_config(shards))
    }

    fn spawn_with(_db: &TestDb, name: &str, config: ShardConfig) -> Self {
        let elector =
            ShardedElector::new(config.check_interval(I).identity(name)).expect("valid config");
        let shutdown = CancellationToken::new();
        let run = tokio::spawn({
            let elector = elector.clone();
            let shutdown = shutdown.clone();
            async move { elector.run(shutdown).await }
        });
        Self {
            elector,
            shutdown,
            run,
        }
    }

    fn owned(&self) -> BTreeSet<u32> {
        self.elector.ownership().shards.keys().copied().collect()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.run.await.expect("no panic").expect("run returns Ok");
    }
}

/// Whether every shard is owned by exactly one member and each owns ⌊K/R⌋ or ⌈K/R⌉.
fn balanced(members: &[&Member], shards: u32) -> bool {
    let counts: Vec<usize> = members.iter().map(|m| m.owned().len()).collect();
    let (lo, hi) = (
        shards as usize / members.len(),
        (shards as usize).div_ceil(members.len()),
    );
    counts.iter().all(|c| (lo..=hi).contains(c)) && counts.iter().sum::<usize>() == shards as usize
}

/// Panics when two members own one shard.
fn assert_disjoint(members: &[&Member]) {
    let mut owner: BTreeMap<u32, usize> = BTreeMap::new();
    for (i, m) in members.iter().enumerate() {
        for shard in m.owned() {
            if let Some(other) = owner.insert(shard, i) {
                panic!("shard {shard} owned by members {other} and {i}");
            }
        }
    }
}

/// The backend pids holding locks of the space, with their shard counts and member flags.
async fn holders(db: &TestDb, class: i32) -> BTreeMap<i32, (bool, usize)> {
    let rows = db
        .admin()
        .query(
            "SELECT pid, bool_or(objid = 4294967295), count(*) FILTER (WHERE objid <> 4294967295) \
             FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid = ($1::int8 & 4294967295)::oid GROUP BY pid",
            &[&i64::from(class)],
        )
        .await
        .expect("pg_locks");
    rows.iter()
        .map(|r| {
            let count: i64 = r.get(2);
            (r.get(0), (r.get(1), count as usize))
        })
        .collect()
}

on_both_backends!(
    #[tokio::test]
    replicas_split_the_space_evenly_each_on_one_lock_session
);
async fn replicas_split_the_space_evenly_each_on_one_lock_session(backend: Backend) {
    let db = TestDb::create(&format!("sharded_split_{backend}"))
        .await
        .unwrap();
    let members: Vec<Member> = (0..4)
        .map(|i| Member::spawn_on(&db, backend, 64, &format!("shard-{i}")))
        .collect();
    let refs: Vec<&Member> = members.iter().collect();
    let took = wait_for(STARTUP, || balanced(&refs, 64)).await;
    assert!(
        took.is_some(),
        "not balanced: {:?}",
        refs.iter().map(|m| m.owned().len()).collect::<Vec<_>>()
    );
    assert_disjoint(&refs);
    let seen = holders(&db, plexsphere_leader::sharded::DEFAULT_SHARD_CLASS).await;
    assert_eq!(seen.len(), 4, "one lock session per replica: {seen:?}");
    assert!(
        seen.values().all(|(member, count)| *member && *count == 16),
        "{seen:?}"
    );
    // Each replica's member id is its session's pid, and the view names every member.
    let view = members[0].elector.view().expect("surveyed");
    assert_eq!(view.members.len(), 4);
    assert!(
        view.members
            .iter()
            .all(|h| h.name.as_deref().is_some_and(|n| n.starts_with("shard-")))
    );
    for m in members {
        m.stop().await;
    }
    assert!(
        holders(&db, plexsphere_leader::sharded::DEFAULT_SHARD_CLASS)
            .await
            .is_empty()
    );
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_join_moves_about_the_joiners_share_without_two_owners
);
async fn a_join_moves_about_the_joiners_share_without_two_owners(backend: Backend) {
    let db = TestDb::create(&format!("sharded_join_{backend}"))
        .await
        .unwrap();
    let k = 60;
    let mut members: Vec<Member> = (0..3)
        .map(|i| Member::spawn_on(&db, backend, k, &format!("shard-{i}")))
        .collect();
    {
        let refs: Vec<&Member> = members.iter().collect();
        assert!(wait_for(STARTUP, || balanced(&refs, k)).await.is_some());
    }
    let before: Vec<BTreeSet<u32>> = members.iter().map(Member::owned).collect();
    members.push(Member::spawn_on(&db, backend, k, "shard-3"));
    let refs: Vec<&Member> = members.iter().collect();
    let bound = 6 * I + MARGIN;
    let mut balanced_after = None;
    let start = std::time::Instant::now();
    while start.elapsed() < bound {
        assert_disjoint(&refs);
        if balanced(&refs, k) {
            balanced_after = Some(start.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = balanced_after.expect("balanced after the join");
    let moved: usize = before
        .iter()
        .zip(&members)
        .map(|(b, m)| b.difference(&m.owned()).count())
        .sum();
    assert_eq!(
        moved,
        members[3].owned().len(),
        "only the joiner's share moved"
    );
    assert!(moved <= (k as usize / 4) * 3 / 2, "moved {moved}");
    eprintln!("join balanced after {took:?}, {moved} shards moved");
    for m in members {
        m.stop().await;
    }
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_graceful_stop_hands_every_shard_over_within_one_interval
);
async fn a_graceful_stop_hands_every_shard_over_within_one_interval(backend: Backend) {
    let db = TestDb::create(&format!("sharded_stop_{backend}"))
        .await
        .unwrap();
    let k = 30;
    let mut members: Vec<Member> = (0..3)
        .map(|i| Member::spawn_on(&db, backend, k, &format!("shard-{i}")))
        .collect();
    {
        let refs: Vec<&Member> = members.iter().collect();
        assert!(wait_for(STARTUP, || balanced(&refs, k)).await.is_some());
    }
    let leaving = members.remove(0);
    let released = leaving.owned();
    leaving.stop().await;
    let refs: Vec<&Member> = members.iter().collect();
    let took = wait_for(I + MARGIN, || {
        released
            .iter()
            .all(|s| refs.iter().any(|m| m.elector.is_owner(*s)))
    })
    .await
    .expect("every released shard has a new owner");
    eprintln!("{} shards handed over in {took:?}", released.len());
    assert!(
        wait_for(4 * I + MARGIN, || balanced(&refs, k))
            .await
            .is_some()
    );
    assert_disjoint(&refs);
    for m in members {
        m.stop().await;
    }
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_terminated_session_demotes_every_shard_at_once_and_others_take_them
);
async fn a_terminated_session_demotes_every_shard_at_once_and_others_take_them(backend: Backend) {
    let db = TestDb::create(&format!("sharded_terminate_{backend}"))
        .await
        .unwrap();
    let k = 30;
    let members: Vec<Member> = (0..3)
        .map(|i| Member::spawn_on(&db, backend, k, &format!("shard-{i}")))
        .collect();
    let refs: Vec<&Member> = members.iter().collect();
    assert!(wait_for(STARTUP, || balanced(&refs, k)).await.is_some());
    let victim = &members[0];
    let pid = victim.elector.ownership().member.expect("a member");
    let lost = victim.owned();
    let mut ownership = victim.elector.subscribe();
    assert!(db.terminate(pid).await.unwrap());
    // The victim learns at once (the session's end wakes it), and drops every shard together.
    tokio::time::timeout(2 * I + MARGIN, ownership.wait_for(|o| o.shards.is_empty()))
        .await
        .expect("demoted in time")
        .expect("elector lives");
    let ends: Vec<_> = victim
        .elector
        .transitions()
        .into_iter()
        .filter(|t| lost.contains(&t.shard))
        .filter_map(|t| t.ended)
        .collect();
    assert_eq!(ends.len(), lost.len());
    assert!(
        ends.iter().all(|c| matches!(c, TermEndCause::Lost(_))),
        "{ends:?}"
    );
    // Every lost shard has a new owner within an interval (the victim rejoins with a new
    // session, so the space then rebalances).
    wait_for(I + MARGIN, || {
        lost.iter()
            .all(|s| refs.iter().any(|m| m.elector.is_owner(*s)))
    })
    .await
    .expect("the lost shards are taken");
    assert!(
        wait_for(8 * I + MARGIN, || balanced(&refs, k))
            .await
            .is_some()
    );
    assert_disjoint(&refs);
    for m in members {
        m.stop().await;
    }
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_handover_waits_for_the_shards_work_before_unlocking
);
async fn a_handover_waits_for_the_shards_work_before_unlocking(backend: Backend) {
    let db = TestDb::create(&format!("sharded_work_{backend}"))
        .await
        .unwrap();
    let k = 2;
    let first = Member::spawn_on(&db, backend, k, "shard-a");
    assert!(
        wait_for(STARTUP, || first.owned().len() == 2)
            .await
            .is_some()
    );
    // Work that holds shard 0's and shard 1's terms until released.
    let release = CancellationToken::new();
    let terms: Vec<_> = (0..2)
        .map(|s| {
            first
                .elector
                .term(s, &CancellationToken::new())
                .expect("owned")
        })
        .collect();
    let second = Member::spawn_on(&db, backend, k, "shard-b");
    // The first replica ends one shard's term for the handover...
    let given = wait_for(STARTUP, || first.owned().len() == 1).await;
    assert!(given.is_some(), "a shard is handed over");
    let handed: u32 = (0..2)
        .find(|s| !first.elector.is_owner(*s))
        .expect("one handed");
    assert!(first.elector.ownership().handing_over.contains(&handed));
    // ...but keeps its lock while the work holds the term: the joiner does not get it.
    tokio::time::sleep(4 * I).await;
    assert!(!second.elector.is_owner(handed), "taken under running work");
    drop(terms);
    drop(release);
    wait_for(2 * I + MARGIN, || second.elector.is_owner(handed))
        .await
        .expect("taken once the work returned");
    first.stop().await;
    second.stop().await;
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_lock_table_too_small_for_the_space_fails_the_run_with_a_typed_error
);
async fn a_lock_table_too_small_for_the_space_fails_the_run_with_a_typed_error(backend: Backend) {
    let db = TestDb::create(&format!("sharded_lock_table_{backend}"))
        .await
        .unwrap();
    let shards = plexsphere_leader::sharded::MAX_SHARDS;
    let member = Member::spawn_on(&db, backend, shards, "shard-big");
    let result = tokio::time::timeout(STARTUP, member.run)
        .await
        .expect("the run ends")
        .expect("no panic");
    let Err(RunError::LockTableTooSmall(too_small)) = result else {
        panic!("expected LockTableTooSmall, got {result:?}");
    };
    assert_eq!(too_small.needed, u64::from(shards) + 1);
    let row = db
        .admin()
        .query_one(
            "SELECT current_setting('max_locks_per_transaction')::int8 * \
             (current_setting('max_connections')::int8 + \
              current_setting('max_prepared_transactions')::int8)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(too_small.capacity, row.get::<_, i64>(0) as u64);
    assert!(too_small.to_string().contains("max_locks_per_transaction"));
    // The closed session's backend exits on its own time: its member lock goes with it,
    // within the margin (the client closed the socket; the server has not necessarily seen it
    // by the time the run returned).
    let class = plexsphere_leader::sharded::DEFAULT_SHARD_CLASS;
    let freed = wait_for_async(MARGIN, || async { holders(&db, class).await.is_empty() }).await;
    assert!(
        freed.is_some(),
        "the member lock is left: {:?}",
        holders(&db, class).await
    );
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    with_fencing_each_shard_term_has_an_epoch_that_fences_off_the_previous_owner
);
async fn with_fencing_each_shard_term_has_an_epoch_that_fences_off_the_previous_owner(
    backend: Backend,
) {
    use plexsphere_leader::LockKey;
    use plexsphere_leader::fencing::{self, FenceError};
    use plexsphere_leader::sharded::DEFAULT_SHARD_CLASS;

    let db = TestDb::create(&format!("sharded_fencing_{backend}"))
        .await
        .unwrap();
    fencing::setup(db.admin()).await.unwrap();
    let k = 4;
    let fenced = |name: &str| {
        let pool = db.backend_pool(backend, name, 4).expect("pool");
        Member::spawn_with(&db, name, pool.shard_config(k).fencing(true))
    };
    let first = fenced("fenced-a");
    assert!(
        wait_for(STARTUP, || first.owned().len() == 4)
            .await
            .is_some()
    );
    let before = first.elector.ownership();
    assert!(
        before.shards.values().all(|s| s.epoch == Some(1)),
        "{before:?}"
    );
    let term = first
        .elector
        .term(0, &CancellationToken::new())
        .expect("owned");
    assert_eq!(term.epoch(), Some(1));
    drop(term);
    let second = fenced("fenced-b");
    let members = [&first, &second];
    assert!(wait_for(STARTUP, || balanced(&members, k)).await.is_some());
    // Every shard the second replica took has a newer epoch than the first one's term had.
    let moved: Vec<u32> = second.owned().into_iter().collect();
    assert_eq!(moved.len(), 2);
    let mut client = db.connect("fence-check").await.unwrap();
    for shard in &moved {
        let epoch = second.elector.ownership().shards[shard]
            .epoch
            .expect("fenced");
        assert_eq!(epoch, 2, "shard {shard}");
        let key = LockKey::new(DEFAULT_SHARD_CLASS, i32::try_from(*shard).unwrap());
        let tx = client.transaction().await.unwrap();
        assert!(matches!(
            fencing::check(&tx, key, 1).await,
            Err(FenceError::Stale {
                epoch: 1,
                current: 2
            })
        ));
        tx.rollback().await.unwrap();
        let tx = client.transaction().await.unwrap();
        fencing::check(&tx, key, epoch)
            .await
            .expect("the owner's epoch passes");
        tx.rollback().await.unwrap();
    }
    drop(client);
    first.stop().await;
    second.stop().await;
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    a_missing_database_is_one_error_and_a_typed_permanent_failure
);
/// Issue 23, item 3, for the sharded elector too (one policy, `failure::CheckFailures`): a
/// database that does not exist is one ERROR with advice, then quiet, and typed permanent.
async fn a_missing_database_is_one_error_and_a_typed_permanent_failure(backend: Backend) {
    use plexsphere_leader::leadership::FailureClass;
    let (logs, _guard) = support::Logs::capture();
    let db = TestDb::create(&format!("sharded_missing_db_{backend}"))
        .await
        .unwrap();
    let mut missing = db.config();
    missing.dbname("no_such_database_plx_shards");
    let pool = backend.pool(&missing, 2).unwrap();
    let member = Member::spawn_with(&db, "sharded-missing", pool.shard_config(8));
    wait_for(STARTUP, || {
        member
            .elector
            .check_failure()
            .is_some_and(|failure| failure.failures >= 4)
    })
    .await
    .expect("at least four failed acquires");
    let failure = member.elector.check_failure().expect("failing");
    assert_eq!(failure.class, FailureClass::Permanent, "{failure:?}");
    assert!(failure.advice.is_some(), "{failure:?}");
    // The published ownership carries the run of failures, as the single election's
    // leadership does.
    let failing = member.elector.ownership().check_failing.expect("published");
    assert_eq!(failing.class, FailureClass::Permanent);
    assert_eq!(failing.since, failure.since);
    assert!(member.owned().is_empty());
    member.stop().await;
    let lines = logs.lines();
    let count = |level: &str| {
        lines
            .iter()
            .filter(|line| line.starts_with(level) && line.contains("no_such_database_plx_shards"))
            .count()
    };
    assert_eq!(count("ERROR"), 1, "{lines:#?}");
    assert_eq!(count("WARN"), 0, "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("ERROR") && line.contains("advice: create the database")),
        "{lines:#?}"
    );
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_sharded_owner_whose_runtime_is_blocked_fails_its_liveness_and_recovers
);
/// The stuck-owner liveness of a sharded replica, as the single election's: live while its
/// surveys prove its shards, `Err` with a bound of two intervals once its runtime's only thread
/// is blocked for four, live again after it.
async fn a_sharded_owner_whose_runtime_is_blocked_fails_its_liveness_and_recovers(
    backend: Backend,
) {
    let db = TestDb::create(&format!("sharded_liveness_{backend}"))
        .await
        .unwrap();
    let pool = db.backend_pool(backend, "stuck-owner", 4).expect("pool");
    let elector = ShardedElector::new(
        pool.shard_config(8)
            .check_interval(I)
            .identity("stuck-owner"),
    )
    .expect("valid config");
    assert!(elector.liveness().is_ok(), "not running: live");

    let block = I * 4;
    let shutdown = CancellationToken::new();
    let (block_tx, thread) = support::on_a_blockable_runtime({
        let (elector, shutdown) = (elector.clone(), shutdown.clone());
        async move { elector.run(shutdown).await }
    });

    wait_for(STARTUP, || elector.ownership().shards.len() == 8)
        .await
        .expect("owns every shard");
    assert!(elector.liveness().is_ok(), "a driven owner is live");

    let blocked_at = tokio::time::Instant::now();
    block_tx.send(block).unwrap();
    let mut stuck = None;
    wait_for(block, || {
        stuck = elector.liveness().err();
        stuck.is_some()
    })
    .await
    .expect("stuck while blocked");
    let stuck = stuck.expect("the verdict");
    println!("liveness failed {:?} into the block", blocked_at.elapsed());
    assert_eq!(stuck.bound, I * 2);
    assert!(stuck.since_last_check > I * 2, "{stuck:?}");
    assert!(
        stuck
            .to_string()
            .contains("the election is not being driven"),
        "{stuck}"
    );
    assert!(
        !elector.ownership().shards.is_empty(),
        "a blocked driver cannot even notice a loss"
    );

    wait_for(block + MARGIN, || elector.liveness().is_ok())
        .await
        .expect("live again after the block");
    assert!(
        blocked_at.elapsed() >= block,
        "not before the thread ran again"
    );

    shutdown.cancel();
    let run = tokio::task::spawn_blocking(move || thread.join())
        .await
        .unwrap()
        .expect("the elector thread did not panic");
    run.expect("run returns Ok");
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_resign_and_an_ineligible_member_leave_the_space_and_rejoin
);
/// A resign gives every shard of the resigning member to the others at their next survey and
/// takes it out of the space (no member lock), and after its hold-off it rejoins and gets its
/// share back; an ineligible member leaves the same way and rejoins only when made eligible.
async fn a_resign_and_an_ineligible_member_leave_the_space_and_rejoin(backend: Backend) {
    use plexsphere_leader::leadership::Resignation;

    let db = TestDb::create(&format!("sharded_resign_{backend}"))
        .await
        .unwrap();
    let k = 8;
    let class = plexsphere_leader::sharded::DEFAULT_SHARD_CLASS;
    let a = Member::spawn_on(&db, backend, k, "shard-a");
    let b = Member::spawn_on(&db, backend, k, "shard-b");
    let both = [&a, &b];
    assert!(wait_for(STARTUP, || balanced(&both, k)).await.is_some());

    let hold_off = 10 * I;
    let resigned = tokio::time::Instant::now();
    assert_eq!(a.elector.resign_for(hold_off), Resignation::Requested);
    let given = wait_for(I + MARGIN, || b.owned().len() == k as usize)
        .await
        .expect("b owns every shard");
    println!("a's shards taken by b {given:?} after the resign");
    assert!(a.owned().is_empty());
    assert!(
        a.elector
            .transitions()
            .iter()
            .filter_map(|t| t.ended)
            .any(|cause| cause == TermEndCause::Resigned),
        "a's terms ended as resigned"
    );
    assert_eq!(holders(&db, class).await.len(), 1, "a left the space");
    assert_disjoint(&both);
    // Back after the hold-off, and the space rebalances.
    assert!(
        wait_for(hold_off + 8 * I + MARGIN, || balanced(&both, k))
            .await
            .is_some()
    );
    assert!(resigned.elapsed() >= hold_off, "not before the hold-off");

    b.elector.set_eligible(false);
    wait_for(I + MARGIN, || a.owned().len() == k as usize)
        .await
        .expect("a owns every shard");
    assert!(!b.elector.is_eligible());
    assert_eq!(holders(&db, class).await.len(), 1, "b left the space");
    tokio::time::sleep(4 * I).await;
    assert!(b.owned().is_empty(), "an ineligible member does not rejoin");
    b.elector.set_eligible(true);
    assert!(
        wait_for(8 * I + MARGIN, || balanced(&both, k))
            .await
            .is_some()
    );
    assert_disjoint(&both);

    let elector = a.elector.clone();
    a.stop().await;
    b.stop().await;
    assert_eq!(
        elector.resign(),
        Resignation::NotRunning,
        "nothing to resign when not running"
    );
    db.cleanup().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The space held by leases (`ShardConfig::lease`): member rows renewed every interval, owner
// rows written when ownership changes; the same members, the same bounds.

/// The lease's TTL of these tests: the default, three intervals.
const LEASE_TTL: Duration = Duration::from_millis(600);

/// The lease tables of a space, in `public`.
async fn lease_tables(db: &TestDb) {
    db.admin()
        .batch_execute(&plexsphere_leader::shard_sql::lease::setup("public"))
        .await
        .unwrap();
}

/// A member holding its shards by leases, on a pool of `backend` over `config` (the database,
/// or a pooler in front of it).
fn lease_member(
    db: &TestDb,
    backend: Backend,
    config: &tokio_postgres::Config,
    shards: u32,
    name: &str,
) -> Member {
    let mut config = config.clone();
    config.application_name(name);
    let pool = backend.pool(&config, 4).expect("pool");
    Member::spawn_with(db, name, pool.shard_config(shards).lease(Duration::ZERO))
}

/// The scenario of a lease space on `config`: three members split `k` shards, every term
/// fenced, the server's owner rows what the members believe; a graceful stop hands the
/// leaver's shards over within an interval.
async fn lease_space_splits_and_hands_over(
    db: &TestDb,
    backend: Backend,
    config: &tokio_postgres::Config,
) {
    let k = 24;
    let mut members: Vec<Member> = (0..3)
        .map(|i| lease_member(db, backend, config, k, &format!("lease-{i}")))
        .collect();
    {
        let refs: Vec<&Member> = members.iter().collect();
        assert!(wait_for(STARTUP, || balanced(&refs, k)).await.is_some());
        assert_disjoint(&refs);
        for m in &refs {
            let ownership = m.elector.ownership();
            assert!(
                ownership.shards.values().all(|s| s.epoch.is_some()),
                "every term fenced"
            );
        }
        let owners = plexsphere_leader_tests::replica_process::shards::owners(
            db.admin(),
            plexsphere_leader_tests::replica_child::Mechanism::Lease,
            plexsphere_leader::sharded::DEFAULT_SHARD_CLASS,
            k,
        )
        .await
        .unwrap();
        let owned: usize = owners.iter().map(|row| row.shards.len()).sum();
        assert_eq!(owned, k as usize, "every shard's row names a live member");
        let believed: usize = refs.iter().map(|m| m.owned().len()).sum();
        assert_eq!(believed, k as usize);
    }
    let leaving = members.remove(0);
    let released = leaving.owned();
    let old_epochs: Vec<(u32, u64)> = leaving
        .elector
        .ownership()
        .shards
        .iter()
        .map(|(shard, owned)| (*shard, owned.epoch.expect("fenced")))
        .collect();
    leaving.stop().await;
    let refs: Vec<&Member> = members.iter().collect();
    let took = wait_for(I + MARGIN, || {
        released
            .iter()
            .all(|s| refs.iter().any(|m| m.elector.is_owner(*s)))
    })
    .await
    .expect("every released shard has a new owner");
    eprintln!("{} leased shards handed over in {took:?}", released.len());
    // A fenced write of the leaver's terms is refused; the new owner's passes.
    let mut writer = db.connect("plx-fenced-writer").await.unwrap();
    let transaction = writer.transaction().await.unwrap();
    for (shard, epoch) in old_epochs {
        let key = plexsphere_leader::LockKey::new(
            plexsphere_leader::sharded::DEFAULT_SHARD_CLASS,
            i32::try_from(shard).unwrap(),
        );
        let stale = plexsphere_leader::fencing::check_in(&transaction, "public", key, epoch).await;
        assert!(
            matches!(
                stale,
                Err(plexsphere_leader::fencing::FenceError::Stale { .. })
            ),
            "shard {shard}, epoch {epoch}: {stale:?}"
        );
        let owner = refs
            .iter()
            .find_map(|m| m.elector.ownership().shards.get(&shard).copied())
            .expect("a new owner");
        let current = owner.epoch.expect("fenced");
        assert!(current > epoch, "shard {shard}: {current} after {epoch}");
        plexsphere_leader::fencing::check_in(&transaction, "public", key, current)
            .await
            .expect("the new owner's epoch");
    }
    drop(transaction);
    assert!(
        wait_for(4 * I + MARGIN, || balanced(&refs, k))
            .await
            .is_some()
    );
    assert_disjoint(&refs);
    for m in members {
        m.stop().await;
    }
}

on_both_backends!(
    #[tokio::test]
    lease_members_split_the_space_fence_every_term_and_hand_over_on_a_graceful_stop
);
async fn lease_members_split_the_space_fence_every_term_and_hand_over_on_a_graceful_stop(
    backend: Backend,
) {
    let db = TestDb::create(&format!("sharded_lease_split_{backend}"))
        .await
        .unwrap();
    lease_tables(&db).await;
    lease_space_splits_and_hands_over(&db, backend, &db.config()).await;
    db.cleanup().await.unwrap();
}

on_both_backends!(
    #[tokio::test]
    behind_a_transaction_mode_pgbouncer_lease_members_split_and_hand_over
);
async fn behind_a_transaction_mode_pgbouncer_lease_members_split_and_hand_over(backend: Backend) {
    let db = TestDb::create(&format!("sharded_lease_bouncer_{backend}"))
        .await
        .unwrap();
    lease_tables(&db).await;
    // Two server connections for three members of four pooled connections each.
    let bouncer = plexsphere_leader_tests::PgBouncer::start(
        &db.config(),
        plexsphere_leader_tests::PoolMode::Transaction,
        2,
    )
    .await
    .expect("PgBouncer");
    lease_space_splits_and_hands_over(&db, backend, &bouncer.pg_config(&db.config())).await;
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_crashed_lease_members_shards_are_taken_once_its_lease_expired_and_never_twice() {
    let db = TestDb::create("sharded_lease_crash").await.unwrap();
    lease_tables(&db).await;
    let k = 24;
    let mut members: Vec<Member> = (0..3)
        .map(|i| {
            lease_member(
                &db,
                Backend::Deadpool,
                &db.config(),
                k,
                &format!("lease-{i}"),
            )
        })
        .collect();
    {
        let refs: Vec<&Member> = members.iter().collect();
        assert!(wait_for(STARTUP, || balanced(&refs, k)).await.is_some());
    }
    // A crash: the run's future is dropped, nothing is released; the member row expires.
    let crashed = members.remove(0);
    let lost = crashed.owned();
    crashed.run.abort();
    let refs: Vec<&Member> = members.iter().collect();
    let took = wait_for(LEASE_TTL + 2 * I + MARGIN, || {
        assert_disjoint(&refs);
        lost.iter()
            .all(|s| refs.iter().any(|m| m.elector.is_owner(*s)))
    })
    .await
    .expect("the crashed member's shards are taken after its lease");
    eprintln!(
        "{} shards of a crashed member re-owned in {took:?}",
        lost.len()
    );
    assert!(
        took >= LEASE_TTL / 2,
        "not before the crashed member's lease could have expired: {took:?}"
    );
    assert!(
        wait_for(4 * I + MARGIN, || balanced(&refs, k))
            .await
            .is_some()
    );
    for m in members {
        m.stop().await;
    }
    db.cleanup().await.unwrap();
}

// Ranked spaces (`ShardConfig::version`, `version_floor`): the new versions take the freed
// shards and the extra slots first; with the floor, the old versions own nothing once a new one
// joined, and a rollback owns shards only when allowed.

/// How a ranked member holds its shards in these scenarios.
#[derive(Debug, Clone, Copy)]
enum Held {
    Advisory,
    Lease,
}

/// A member of `version` (the floor on or off, allowed below it or not) on `config`.
#[allow(clippy::too_many_arguments)] // reason: a test's spelled-out cast of one member
fn ranked_member(
    db: &TestDb,
    backend: Backend,
    config: &tokio_postgres::Config,
    held: Held,
    shards: u32,
    name: &str,
    version: &str,
    floor: (bool, bool),
) -> Member {
    let mut config = config.clone();
    config.application_name(name);
    let pool = backend.pool(&config, 4).expect("pool");
    let mut shard_config = pool
        .shard_config(shards)
        .version(version)
        .version_floor(floor.0)
        .below_version_floor(floor.1);
    if let Held::Lease = held {
        shard_config = shard_config.lease(Duration::ZERO);
    }
    Member::spawn_with(db, name, shard_config)
}

/// The space's floor row, as the server keeps it.
async fn space_floor(db: &TestDb, held: Held) -> Option<String> {
    let table = match held {
        Held::Advisory => plexsphere_leader::floor::FLOOR_TABLE.to_owned(),
        Held::Lease => plexsphere_leader::shard_sql::lease::floor_table("public"),
    };
    let row = db
        .admin()
        .query_opt(
            &format!("SELECT version FROM {table} WHERE classid = $1 AND objid = -1"),
            &[&plexsphere_leader::sharded::DEFAULT_SHARD_CLASS],
        )
        .await
        .expect("the floor table");
    row.map(|row| row.get(0))
}

/// A rolling deploy over `k` = 6 shards with the floor: two members of 1.9.0 split the space;
/// a member of 1.10.0 joins and raises the floor, and the old ones give every shard up to it
/// (each says so once and is below the floor); an old member started again owns nothing; one
/// allowed below the floor sets it back to 1.9.0, and then the old ones own shards again.
async fn a_ranked_space_with_the_floor(
    db: &TestDb,
    backend: Backend,
    config: &tokio_postgres::Config,
    held: Held,
) {
    let k = 6;
    let member = |name: &str, version: &str, allowed: bool| {
        ranked_member(db, backend, config, held, k, name, version, (true, allowed))
    };
    let old: Vec<Member> = (0..2)
        .map(|i| member(&format!("old-{i}"), "1.9.0", false))
        .collect();
    let refs: Vec<&Member> = old.iter().collect();
    assert!(wait_for(STARTUP, || balanced(&refs, k)).await.is_some());
    assert_eq!(space_floor(db, held).await.as_deref(), Some("1.9.0"));
    let new = member("new-0", "1.10.0", false);
    // A rebalance delay, then the old ones' handovers (two moves per interval each) and the
    // new member's takes: a few intervals.
    let moved = wait_for(8 * I + MARGIN, || {
        new.owned().len() == k as usize && old.iter().all(|m| m.owned().is_empty())
    })
    .await
    .expect("every shard moves to the new version");
    eprintln!("{held:?}: every shard moved to the new version in {moved:?}");
    assert_eq!(space_floor(db, held).await.as_deref(), Some("1.10.0"));
    assert!(old.iter().all(|m| m.elector.is_below_version_floor()));
    assert!(!new.elector.is_below_version_floor());
    let view = new.elector.view().expect("a survey");
    assert_eq!(view.floor.map(|v| v.to_string()).as_deref(), Some("1.10.0"));
    let below: Vec<bool> = view.members.iter().map(|h| h.below_floor).collect();
    assert_eq!(below.iter().filter(|b| **b).count(), 2, "{view:?}");
    assert!(view.members.iter().all(|h| h.rank.is_some()));
    for m in old {
        m.stop().await;
    }
    // An accidental rollback: an old binary joins and owns nothing.
    let accident = member("old-2", "1.9.0", false);
    tokio::time::sleep(4 * I).await;
    assert!(accident.owned().is_empty() && accident.elector.is_below_version_floor());
    assert_eq!(new.owned().len(), k as usize);
    // A deliberate one: allowed below the floor, it lowers it, and both old ones own shards.
    let rollback = member("old-3", "1.9.0", true);
    let all = [&new, &accident, &rollback];
    assert!(
        wait_for(8 * I + MARGIN, || balanced(&all, k))
            .await
            .is_some(),
        "the space is balanced over every version again"
    );
    assert_disjoint(&all);
    assert_eq!(space_floor(db, held).await.as_deref(), Some("1.9.0"));
    for m in [new, accident, rollback] {
        m.stop().await;
    }
}

/// Without the floor: one member of 1.9.0 and one of 1.10.0 split 5 shards, and the new one
/// carries the remainder (3 against 2).
async fn a_ranked_space_without_the_floor(db: &TestDb, backend: Backend, held: Held) {
    let k = 5;
    let config = db.config();
    let old = ranked_member(
        db,
        backend,
        &config,
        held,
        k,
        "old",
        "1.9.0",
        (false, false),
    );
    let new = ranked_member(
        db,
        backend,
        &config,
        held,
        k,
        "new",
        "1.10.0",
        (false, false),
    );
    let both = [&old, &new];
    assert!(
        wait_for(STARTUP, || old.owned().len() == 2 && new.owned().len() == 3)
            .await
            .is_some(),
        "the new version carries the extra shard: {:?} {:?}",
        old.owned(),
        new.owned()
    );
    assert_disjoint(&both);
    assert_eq!(space_floor(db, held).await, None, "no floor is written");
    old.stop().await;
    new.stop().await;
}

/// A database with the floor table (and, for leases, the lease tables) of a ranked space.
async fn ranked_db(name: &str, held: Held) -> TestDb {
    let db = TestDb::create(name).await.unwrap();
    match held {
        Held::Advisory => plexsphere_leader::floor::setup(db.admin()).await.unwrap(),
        Held::Lease => lease_tables(&db).await,
    }
    db
}

#[tokio::test]
async fn with_the_floor_an_advisory_space_moves_to_the_new_version_and_a_rollback_needs_allowing() {
    let db = ranked_db("sharded_ranked_floor_advisory", Held::Advisory).await;
    a_ranked_space_with_the_floor(&db, Backend::Deadpool, &db.config(), Held::Advisory).await;
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn with_the_floor_a_lease_space_moves_to_the_new_version_and_a_rollback_needs_allowing() {
    let db = ranked_db("sharded_ranked_floor_lease", Held::Lease).await;
    a_ranked_space_with_the_floor(&db, Backend::Sqlx, &db.config(), Held::Lease).await;
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn behind_a_transaction_mode_pgbouncer_a_ranked_lease_space_keeps_its_floor() {
    let db = ranked_db("sharded_ranked_floor_bouncer", Held::Lease).await;
    let bouncer = plexsphere_leader_tests::PgBouncer::start(
        &db.config(),
        plexsphere_leader_tests::PoolMode::Transaction,
        2,
    )
    .await
    .expect("PgBouncer");
    let config = bouncer.pg_config(&db.config());
    a_ranked_space_with_the_floor(&db, Backend::Deadpool, &config, Held::Lease).await;
    db.cleanup().await.unwrap();
}

#[tokio::test]
async fn without_the_floor_the_new_version_carries_the_extra_shard_on_both_mechanisms() {
    for (held, name) in [(Held::Advisory, "advisory"), (Held::Lease, "lease")] {
        let db = ranked_db(&format!("sharded_ranked_plain_{name}"), held).await;
        a_ranked_space_without_the_floor(&db, Backend::Deadpool, held).await;
        db.cleanup().await.unwrap();
    }
}

#[tokio::test]
async fn a_bad_version_or_a_floor_without_a_version_is_a_typed_config_error() {
    let db = TestDb::create("sharded_ranked_config").await.unwrap();
    let pool = db.pool(1).unwrap();
    let bad = ShardedElector::new(ShardConfig::new(pool.clone(), 4).version("1.x"));
    assert!(
        matches!(bad, Err(plexsphere_leader::ConfigError::Version(_))),
        "{:?}",
        bad.err()
    );
    let floor = ShardedElector::new(ShardConfig::new(pool.clone(), 4).version_floor(true));
    assert!(
        matches!(
            floor,
            Err(plexsphere_leader::ConfigError::FloorWithoutVersion)
        ),
        "{:?}",
        floor.err()
    );
    let ranked = ShardedElector::new(
        ShardConfig::new(pool, 4)
            .priority(2)
            .version_floor(true)
            .below_version_floor(true),
    );
    assert!(ranked.is_ok(), "a priority alone ranks the replica");
    db.cleanup().await.unwrap();
}
