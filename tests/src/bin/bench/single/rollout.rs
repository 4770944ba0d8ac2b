//! `bench single`: ranked replicas (issue 41): the handover when a better-ranked candidate
//! preempts the leader, and rolling deploys of three replicas, ranked beside unranked.
//!
//! Replicas are OS processes (`bench replica … --version V`) on one merged timeline, as in the
//! failover table; each round or rollout runs on a throwaway database.

use std::collections::HashMap;

use plexsphere_leader_tests::replica_process::wait_sole_leader;

use super::failover::replica_launcher;
use super::*;

/// The version of the replicas a rollout replaces.
const OLD: &str = "1.0.0";
/// The version a rollout deploys.
const NEW: &str = "1.1.0";
/// Replicas of a rollout.
const FLEET: usize = 3;
/// The WARN of a standby whose deferral ran out (`LogKind::DeferLimitReached`).
const DEFER_LIMIT_WARN: &str = "leader: a better-ranked candidate did not take over";

pub(super) async fn rollout(options: &Options) -> Result<(), BoxError> {
    let interval = options.interval;
    // The defaults of `Config::preempt_window` and `Config::stop_grace`.
    let window = 2 * interval;
    let grace = interval;
    println!(
        "\n## Rollout: ranked replicas (`Config::version`, I = {interval:?}, W = 2·I = \
         {window:?}, stop grace = I = {grace:?})"
    );
    handover_table(options, window, grace).await?;
    rollout_table(options, window).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Handover on preemption

/// One preemption round: a leader of version [`OLD`], then a candidate of version [`NEW`].
#[derive(Debug, Clone)]
struct Handover {
    /// From the candidate's `ready` (its run starts: its candidacy is published at its first
    /// check) to its term's begin.
    from_live: Duration,
    /// From the old leader's term end to the new term's begin: the time without a leader.
    after_yield: Duration,
    /// The longest span both believed they led.
    overlap: Duration,
    /// The old leader's end cause.
    cause: String,
    /// Whether leadership went back to the old replica within 2·W after.
    went_back: bool,
}

async fn handover_table(
    options: &Options,
    window: Duration,
    grace: Duration,
) -> Result<(), BoxError> {
    let interval = options.interval;
    println!(
        "\n### Handover on preemption ({} rounds per mechanism)\n\n\
         A leader of version {OLD} has led for W; a replica of version {NEW} starts at a random \
         phase of the leader's checks. \"From live\": from the candidate's start (its `ready`: \
         its run begins, its first check publishes its candidacy) to its term's begin; \"after \
         W\": the same minus W; \"yield → term\": from the old leader's term end to the new \
         term's begin (no leader meanwhile).\n",
        options.rounds
    );
    println!(
        "| mechanism | from live: bound | p50 | p99 | max | after W: p50 | p99 | max | yield → term: p50 | p99 | max | overlap: max | old leader's end | back to the old |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for held in [Held::Queue, Held::Lease] {
        let mut rounds = Vec::new();
        let mut failures = Vec::new();
        for _ in 0..options.rounds {
            match handover_round(held, interval, window).await {
                Ok(round) => rounds.push(round),
                Err(e) => failures.push(e.to_string()),
            }
        }
        let bound = match held {
            Held::Lease => format!("W + grace + I = {}", ms(window + grace + interval)),
            _ => format!(
                "W + grace + 10 ms = {}",
                ms(window + grace + Duration::from_millis(10))
            ),
        };
        let from_live: Vec<Duration> = rounds.iter().map(|r| r.from_live).collect();
        let after_w: Vec<Duration> = from_live.iter().map(|d| d.saturating_sub(window)).collect();
        let after_yield: Vec<Duration> = rounds.iter().map(|r| r.after_yield).collect();
        let overlap = rounds.iter().map(|r| r.overlap).max().unwrap_or_default();
        let mut causes: Vec<String> = rounds.iter().map(|r| r.cause.clone()).collect();
        causes.sort();
        causes.dedup();
        let back = rounds.iter().filter(|r| r.went_back).count();
        println!(
            "| {} ({} rounds) | {bound} | {} | {} | {} | {} | {} | {} |",
            held.name(),
            rounds.len(),
            stats3(&from_live),
            stats3(&after_w),
            stats3(&after_yield),
            ms(overlap),
            causes.join(", "),
            back
        );
        for failure in failures {
            eprintln!("  handover, {}: a round failed: {failure}", held.name());
        }
    }
    Ok(())
}

/// `p50 | p99 | max`.
fn stats3(values: &[Duration]) -> String {
    if values.is_empty() {
        return "— | — | —".into();
    }
    format!(
        "{} | {} | {}",
        fine_ms(percentile(values, 50)),
        fine_ms(percentile(values, 99)),
        fine_ms(percentile(values, 100))
    )
}

/// The arguments of a replica of `held` named `name`, ranked by `version` when given.
fn child(
    held: Held,
    name: &str,
    dsn: &str,
    interval: Duration,
    version: Option<&str>,
) -> ChildArgs {
    ChildArgs {
        queued: held == Held::Queue,
        mechanism: held.mechanism(),
        version: version.map(str::to_owned),
        ..ChildArgs::new(format!("{REPLICA_APP_PREFIX}{name}"), dsn, interval)
    }
}

/// A throwaway database, with the lease tables when `held` is the lease (the floor table
/// among them), else the advisory lock's floor table.
async fn database(held: Held) -> Result<TestDb, BoxError> {
    let db = TestDb::create("bench_rollout").await?;
    if held == Held::Lease {
        plexsphere_leader::lease::setup(db.admin()).await?;
    } else {
        plexsphere_leader::floor::setup(db.admin()).await?;
    }
    Ok(db)
}

async fn handover_round(
    held: Held,
    interval: Duration,
    window: Duration,
) -> Result<Handover, BoxError> {
    let db = database(held).await?;
    let dsn = dsn(&db.config());
    let launcher = replica_launcher()?;
    let timeline = Timeline::new();
    let mut old = launcher
        .spawn_with_timeline(child(held, "old", &dsn, interval, Some(OLD)), &timeline)
        .await?;
    let round = async {
        old.wait_for(ROUND_TIMEOUT, |r| r.event == LEAD)
            .await
            .ok_or("the old replica never led")?;
        // The leader has led for W: only the candidate's window is left.
        tokio::time::sleep(window).await;
        random_phase(interval).await;
        let mut new = launcher
            .spawn_with_timeline(child(held, "new", &dsn, interval, Some(NEW)), &timeline)
            .await?;
        let measured = async {
            let live = new
                .wait_for(ROUND_TIMEOUT, |r| r.event == "ready")
                .await
                .ok_or("no ready")?
                .at;
            let lead = new
                .wait_for(ROUND_TIMEOUT, |r| r.event == LEAD)
                .await
                .ok_or("the new replica never led")?
                .at;
            let end = old
                .wait_for(ROUND_TIMEOUT, |r| r.event == FOLLOW)
                .await
                .ok_or("the old leader never ended its term")?;
            // Watched for 2·W more: leadership stays with the newer replica.
            tokio::time::sleep(2 * window).await;
            let intervals = timeline.intervals(LEAD, FOLLOW, Instant::now());
            Ok::<_, BoxError>(Handover {
                from_live: lead.saturating_duration_since(live),
                after_yield: lead.saturating_duration_since(end.at),
                overlap: timeline::max_overlap(&intervals),
                cause: end.str("cause").unwrap_or("?").to_owned(),
                went_back: old.events(LEAD).len() > 1,
            })
        }
        .await;
        new.stop().await?;
        measured
    }
    .await;
    old.stop().await?;
    wait_clean(db.admin(), REPLICA_APP_PREFIX, ROUND_TIMEOUT).await?;
    db.cleanup().await?;
    round
}

// ---------------------------------------------------------------------------------------------
// Rolling deploys

/// What one rolling deploy replaces with what, how the replicas hold and whether they rank.
#[derive(Debug, Clone, Copy)]
struct Plan {
    held: Held,
    ranked: bool,
    /// The surge order of a Kubernetes rolling update (`maxSurge: 1`, `maxUnavailable: 0`):
    /// each step starts the new replica and lets it settle before it stops an old one. Else
    /// each step stops an old replica first, then starts the new one.
    surge: bool,
    /// Every replica runs with the version floor (`Config::version_floor`), and the deployed
    /// ones may lead below it (`Config::below_version_floor`): a deliberate rollback.
    floor: bool,
    from: &'static str,
    to: &'static str,
}

impl Plan {
    fn name(self) -> String {
        format!(
            "{} → {}, {}{}, {}",
            self.from,
            self.to,
            if self.surge {
                "new first (surge), "
            } else {
                ""
            },
            match (self.ranked, self.floor) {
                (true, true) => "ranked, floor, rollback allowed",
                (true, false) => "ranked",
                (false, _) => "unranked (today)",
            },
            match self.held {
                Held::Lease => "lease",
                _ => "queued advisory lock",
            }
        )
    }
}

/// One rolling deploy's leadership.
#[derive(Debug, Clone, Default)]
struct Deploy {
    /// Leadership moves (a term begun by another replica than the one before).
    moves: usize,
    /// Moves from a replica of the plan's `from` version to one of its `to` version.
    to_target: usize,
    /// Moves from a `to` replica back to a `from` one.
    back: usize,
    /// Moves between replicas of one version.
    within: usize,
    /// The time nobody led, summed over the deploy.
    leaderless: Duration,
    /// Its longest single span.
    longest_gap: Duration,
    overlap: Duration,
    /// Terms that ended `Yielded`.
    yielded: usize,
    /// The WARNs `leader: a better-ranked candidate did not take over within the defer limit`
    /// of every replica, before and during the deploy.
    defer_warns: usize,
    /// The version leading at the end.
    last: String,
    /// The step (0-based) that stopped the replica leading before the deploy.
    position: usize,
}

async fn rollout_table(options: &Options, window: Duration) -> Result<(), BoxError> {
    let deploys = FLEET * options.rounds.div_ceil(5).max(1);
    println!(
        "\n### Rolling deploys of {FLEET} replicas, one at a time ({deploys} deploys per row: \
         {FLEET} per 5 `--rounds`)\n\n\
         {FLEET} replicas of the old version run; then, one at a time: stop one old replica \
         gracefully (SIGTERM), start one of the new version, wait W + 2·I and until one replica \
         leads, next. The surge rows (new first: a Kubernetes rolling update's `maxSurge: 1`, \
         `maxUnavailable: 0`) start the new replica first, wait W + 2·I and until one replica \
         leads, then stop the old one and wait again. The step that stops the replica leading before the deploy rotates over \
         the deploys (1st, 2nd, 3rd, 1st, …): counts read `1st / 2nd / 3rd`, each the min–max \
         over the deploys of that position. Ranked replicas carry `--version`, unranked ones \
         none (today's behaviour), in the same run. A move is a term begun by another replica \
         than the last; \"old → new\" counts moves from the row's old version to its new one, \
         \"new → old\" moves back. Leaderless: the time nobody led from the first stop to the \
         last step's end, summed per deploy (and its longest span). Defer-limit WARNs: every \
         replica's `did not take over within the defer limit`, summed per deploy. Goal, ranked with the \
         queued lock: exactly 1 move old → new per rollout, none new → old, leaderless ≤ 10 ms \
         in total.\n"
    );
    println!(
        "| deploy | moves | old → new | new → old | within a version | yielded terms | defer-limit WARNs | leaderless per deploy: p50 | max | longest span | overlap: max | leads at the end |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let plan = |held, ranked, from, to| Plan {
        held,
        ranked,
        surge: false,
        floor: false,
        from,
        to,
    };
    let surge = |plan: Plan| Plan {
        surge: true,
        ..plan
    };
    let with_floor = |plan: Plan| Plan {
        floor: true,
        ..plan
    };
    let plans = [
        plan(Held::Queue, true, OLD, NEW),
        surge(plan(Held::Queue, true, OLD, NEW)),
        plan(Held::Queue, false, OLD, NEW),
        plan(Held::Lease, true, OLD, NEW),
        surge(plan(Held::Lease, true, OLD, NEW)),
        plan(Held::Lease, false, OLD, NEW),
        plan(Held::Queue, true, NEW, OLD),
        plan(Held::Lease, true, NEW, OLD),
        with_floor(plan(Held::Queue, true, NEW, OLD)),
        with_floor(plan(Held::Lease, true, NEW, OLD)),
    ];
    for plan in plans {
        let mut done = Vec::new();
        let mut failures = Vec::new();
        for d in 0..deploys {
            match deploy(plan, options.interval, window, d % FLEET).await {
                Ok(d) => done.push(d),
                Err(e) => failures.push(e.to_string()),
            }
        }
        print_deploys(plan, &done);
        for failure in failures {
            eprintln!("  rollout {}: a deploy failed: {failure}", plan.name());
        }
    }
    println!(
        "\nThe rollback rows (1.1.0 → 1.0.0) measure what ranks do when an older version is \
         deployed: ranks alone, then with the version floor on every replica \
         (Config::version_floor) and the deployed 1.0.0 replicas allowed below it \
         (Config::below_version_floor, a deliberate rollback). Without that override a 1.0.0 \
         replica would not lead at all once 1.1.0 has led."
    );
    Ok(())
}

/// `a` or `a–b`.
fn span_of(values: impl Iterator<Item = usize> + Clone) -> String {
    let (min, max) = (values.clone().min(), values.max());
    match (min, max) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) => format!("{a}–{b}"),
        _ => "—".into(),
    }
}

/// `1st / 2nd / 3rd`: `count` over the deploys that stopped the old leader at each step.
fn by_position(done: &[Deploy], count: impl Fn(&Deploy) -> usize) -> String {
    (0..FLEET)
        .map(|p| span_of(done.iter().filter(|d| d.position == p).map(&count)))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn print_deploys(plan: Plan, done: &[Deploy]) {
    let totals: Vec<Duration> = done.iter().map(|d| d.leaderless).collect();
    let longest = done.iter().map(|d| d.longest_gap).max().unwrap_or_default();
    let overlap = done.iter().map(|d| d.overlap).max().unwrap_or_default();
    let mut last: Vec<&str> = done.iter().map(|d| d.last.as_str()).collect();
    last.sort_unstable();
    last.dedup();
    println!(
        "| {} ({} deploys) | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        plan.name(),
        done.len(),
        by_position(done, |d| d.moves),
        by_position(done, |d| d.to_target),
        by_position(done, |d| d.back),
        by_position(done, |d| d.within),
        by_position(done, |d| d.yielded),
        by_position(done, |d| d.defer_warns),
        fine_ms(percentile(&totals, 50)),
        fine_ms(percentile(&totals, 100)),
        fine_ms(longest),
        ms(overlap),
        last.join(", ")
    );
}

/// One rolling deploy of `plan` on a database of its own, whose step `position` (0-based)
/// stops the replica leading before it.
async fn deploy(
    plan: Plan,
    interval: Duration,
    window: Duration,
    position: usize,
) -> Result<Deploy, BoxError> {
    let db = database(plan.held).await?;
    let dsn = dsn(&db.config());
    let launcher = replica_launcher()?;
    let timeline = Timeline::new();
    let mut versions: HashMap<String, &'static str> = HashMap::new();
    let mut running: Vec<ReplicaProcess> = Vec::new();
    let mut stopped: Vec<ReplicaProcess> = Vec::new();
    let start = |i: usize, version: &'static str| {
        let deployed = version != plan.from;
        let name = format!("{}{i}", if deployed { "to" } else { "from" });
        ChildArgs {
            version_floor: plan.floor,
            below_version_floor: plan.floor && deployed,
            ..child(
                plan.held,
                &name,
                &dsn,
                interval,
                plan.ranked.then_some(version),
            )
        }
    };
    let outcome = async {
        for i in 0..FLEET {
            let args = start(i, plan.from);
            versions.insert(args.name.clone(), plan.from);
            running.push(launcher.spawn_with_timeline(args, &timeline).await?);
        }
        // The old leader has led for W, and every standby is a live candidate.
        tokio::time::sleep(window + interval).await;
        let leader = wait_sole_leader(&running, ROUND_TIMEOUT)
            .await
            .ok_or("no sole leader before the deploy")?;
        // The stop order: the others in start order, the leader at `position`.
        let leader_name = running[leader].name().to_owned();
        let mut order: Vec<String> = running
            .iter()
            .map(|r| r.name().to_owned())
            .filter(|name| *name != leader_name)
            .collect();
        order.insert(position.min(order.len()), leader_name);
        let began = Instant::now();
        for (i, name) in order.iter().enumerate() {
            let args = start(i, plan.to);
            versions.insert(args.name.clone(), plan.to);
            if plan.surge {
                // The new replica first: its candidacy live for W, and surveyed by the leader.
                running.push(
                    launcher
                        .spawn_with_timeline(args.clone(), &timeline)
                        .await?,
                );
                tokio::time::sleep(window + 2 * interval).await;
                wait_sole_leader(&running, ROUND_TIMEOUT)
                    .await
                    .ok_or("no sole leader after a new replica started")?;
            }
            let at = running
                .iter()
                .position(|r| r.name() == name)
                .ok_or("a replica of the stop order is gone")?;
            let mut old = running.remove(at);
            old.stop().await?;
            stopped.push(old);
            if !plan.surge {
                running.push(launcher.spawn_with_timeline(args, &timeline).await?);
            }
            tokio::time::sleep(window + 2 * interval).await;
            wait_sole_leader(&running, ROUND_TIMEOUT)
                .await
                .ok_or("no sole leader after a step")?;
        }
        let ended = Instant::now();
        let mut deploy = analyse(plan, &timeline, &versions, &running, &stopped, began, ended);
        deploy.position = position;
        // The terms, to stderr: what the counts summarize.
        let terms: Vec<String> = timeline
            .events()
            .iter()
            .map(|e| {
                let at = match e.at.checked_duration_since(began) {
                    Some(after) => format!("+{}", ms(after)),
                    None => "before".into(),
                };
                let name = e.replica.trim_start_matches(REPLICA_APP_PREFIX);
                format!(
                    "{at} {name}@{} {}",
                    versions.get(&e.replica).unwrap_or(&"?"),
                    e.event
                )
            })
            .collect();
        eprintln!(
            "  rollout {}, old leader stopped at step {}: {}",
            plan.name(),
            position + 1,
            terms.join(", ")
        );
        Ok::<_, BoxError>(deploy)
    }
    .await;
    for mut replica in running.into_iter().chain(stopped) {
        replica.stop().await.ok();
    }
    wait_clean(db.admin(), REPLICA_APP_PREFIX, ROUND_TIMEOUT).await?;
    db.cleanup().await?;
    outcome
}

/// Counts the deploy's moves, leaderless time and overlap from the merged timeline.
fn analyse(
    plan: Plan,
    timeline: &Timeline,
    versions: &HashMap<String, &'static str>,
    running: &[ReplicaProcess],
    stopped: &[ReplicaProcess],
    began: Instant,
    ended: Instant,
) -> Deploy {
    let leads: Vec<timeline::Event> = timeline
        .events()
        .into_iter()
        .filter(|e| e.event == LEAD && e.at <= ended)
        .collect();
    let version = |replica: &str| versions.get(replica).copied().unwrap_or("?");
    let mut deploy = Deploy::default();
    for pair in leads.windows(2) {
        let (from, to) = (&pair[0], &pair[1]);
        if from.replica == to.replica {
            continue;
        }
        deploy.moves += 1;
        match (version(&from.replica), version(&to.replica)) {
            (a, b) if a == b => deploy.within += 1,
            (a, b) if a == plan.from && b == plan.to => deploy.to_target += 1,
            _ => deploy.back += 1,
        }
    }
    let intervals = timeline.intervals(LEAD, FOLLOW, ended);
    let gaps = timeline::leaderless_gaps(
        &intervals,
        Span {
            start: began,
            end: ended,
        },
    );
    deploy.leaderless = gaps.iter().map(Span::duration).sum();
    deploy.longest_gap = gaps.iter().map(Span::duration).max().unwrap_or_default();
    deploy.overlap = timeline::max_overlap(&intervals);
    deploy.yielded = running
        .iter()
        .chain(stopped)
        .flat_map(|r| r.events(FOLLOW))
        .filter(|r| r.str("cause") == Some("Yielded"))
        .count();
    deploy.defer_warns = running
        .iter()
        .chain(stopped)
        .map(|r| r.logs("WARN", DEFER_LIMIT_WARN).len())
        .sum();
    deploy.last = leads
        .last()
        .map(|e| version(&e.replica).to_owned())
        .unwrap_or_else(|| "nobody".into());
    deploy
}
