//! The sharded election state machine of one replica.
//!
//! | behaviour | input | actions | test |
//! |---|---|---|---|
//! | a check every interval: a replica without a session acquires one | `start`, [`ShardTimer::NextCheck`] | `AcquireSession` | `start_acquires_a_session_at_once` |
//! | the session joins the space and is bounded by `idle_session_timeout` | `Acquired` | `Register` | `an_acquired_session_registers_with_four_intervals_of_idle_timeout` |
//! | a lock table too small for `K + R` ends the run with a typed error | `Registered` | `CloseSession`, `Fail`, `Finish` | `a_lock_table_too_small_fails_the_run` |
//! | joined: the session leaves the pool and the first survey runs | `Registered` | `Detach`, `Log(Joined)`, `Survey` | `a_registered_session_detaches_and_surveys_at_once` |
//! | a cold start waits the rebalance delay before its first take | `Surveyed` (nothing held) | none until the delay passed | `a_cold_start_waits_the_rebalance_delay_then_takes_its_share` |
//! | free shards are taken at once up to the cap | `Surveyed` | `Take` | `free_shards_are_taken_at_once_when_others_hold_shards` |
//! | granted shards begin terms | `Took` | `BeginTerm` each, `Log(Took)` | `granted_shards_begin_terms_and_refused_ones_do_not` |
//! | with fencing, granted shards' epochs advance first; a failure releases them | `Took`, `EpochsAdvanced`, `StatementFailed` | `AdvanceEpochs`, then `BeginTerm { epoch }`, or `Log(FencingFailed)` and `Unlock` | `with_fencing_granted_shards_begin_terms_with_their_epochs` |
//! | a survey that disproves a believed shard loses the session | `Surveyed` | `EndTerm(Lost)` each, `CloseSession`, `Log(SessionLost)` | `a_survey_missing_an_owned_shard_loses_every_shard_and_the_session` |
//! | over the cap after the delay: end terms, await work, unlock, limited per interval | `Surveyed`, `WorkDrained` | `EndTerm(HandedOver)`, `AwaitWork`, `Unlock` | `a_join_hands_the_excess_over_after_the_delay_work_first_then_unlock` |
//! | a failed or unanswered statement loses the session | `StatementFailed`, [`ShardTimer::StatementDeadline`] | `EndTerm(Lost)`, `CloseSession` | `an_unanswered_survey_loses_every_shard_after_one_interval` |
//! | stop: terms end, work awaited, all locks released in one statement | `Cancelled`, `WorkDrained` | `EndTerm(Stopped)`, `AwaitWork`, `UnlockAll`, `CloseSession`, `Finish` | `a_stop_ends_every_term_awaits_the_work_then_unlocks_all` |
//! | a panic abandons the locks: terms end as lost, the session closes | `Panicked` | `EndTerm(Lost(Panicked))`, `CloseSession`, `Finish` | `a_panic_ends_every_term_as_lost_and_closes_without_unlocking` |

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use super::{
    MemberId, Shard, ShardAction, ShardEvent, ShardLog, ShardLogKind, ShardOptions, Survey,
};
use crate::action::{Cause, LossReason, TermEndCause};
use crate::election::{AlreadyRunning, Handled, Ignored};
use crate::ids::{ConnId, TermId};
use crate::interval::UNLOCK_BUDGET;
use crate::schedule::Schedule;

/// The sharded election of one replica: its member session, and the shards it owns.
///
/// The same contract as [`Election`](crate::Election): feed inputs stamped with a
/// non-decreasing `now`, drain [`poll_action`](Self::poll_action) after each, call
/// [`handle_timeout`](Self::handle_timeout) at [`poll_timeout`](Self::poll_timeout), echo each
/// action's [`ConnId`] in its completion.
#[derive(Debug)]
pub struct ShardedElection<C> {
    options: ShardOptions,
    run: Option<Run>,
    actions: VecDeque<ShardAction<C>>,
    last_conn: u64,
    last_term: u64,
    last_survey: Option<Survey>,
}

/// How many deadlines one [`ShardedElection::handle_timeout`] may fire: each kind at most once.
const MAX_FIRES: usize = 5;

/// Which deadline [`ShardedElection::poll_timeout`] stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardTimer {
    /// The next check (survey, or acquire without a session) is due.
    NextCheck,
    /// The session acquire must have completed.
    AcquireDeadline,
    /// The statement on the session must have answered (one interval; two seconds for the
    /// final release).
    StatementDeadline,
    /// A graceful stop's grace for shard work is over.
    DrainDeadline,
    /// A handed-over shard's work outlived the handover grace.
    HandoverOverdue,
}

/// A coarse name of the current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardPhase {
    /// Not running.
    Idle,
    /// No session: waiting for the next check.
    Detached,
    /// Acquiring a session.
    Acquiring,
    /// Taking the member lock.
    Registering,
    /// A member, between statements.
    Member,
    /// A member, running a statement.
    Busy,
    /// Stopping: terms ended, work awaited or locks being released.
    Stopping,
}

#[derive(Debug)]
struct Run {
    schedule: Schedule,
    next_check: Option<Instant>,
    session: Session,
    owned: BTreeMap<Shard, TermId>,
    handing: BTreeMap<Shard, Handover>,
    /// Granted shards whose fencing failed: held without a term, unlocked at the next chance.
    release: BTreeSet<Shard>,
    pending_take: Vec<Shard>,
    members: Vec<MemberId>,
    members_since: Instant,
    stop: Option<Stop>,
}

#[derive(Debug)]
enum Session {
    None,
    Acquiring { conn: ConnId, deadline: Instant },
    Registering { conn: ConnId, deadline: Instant },
    Open(Open),
}

#[derive(Debug)]
struct Open {
    conn: ConnId,
    backend: MemberId,
    joined_at: Instant,
    busy: Option<(Op, Instant)>,
    survey_due: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Survey,
    Take(Vec<Shard>),
    Fence(Vec<Shard>),
    Unlock(Vec<Shard>),
    UnlockAll,
}

#[derive(Debug, Clone, Copy)]
struct Handover {
    term: TermId,
    overdue_at: Instant,
    drained: bool,
    warned: bool,
}

#[derive(Debug)]
struct Stop {
    deadline: Instant,
    awaiting: BTreeSet<TermId>,
}

impl<C> ShardedElection<C> {
    /// A sharded election with these options, not running.
    pub fn new(options: ShardOptions) -> Self {
        Self {
            options,
            run: None,
            actions: VecDeque::new(),
            last_conn: 0,
            last_term: 0,
            last_survey: None,
        }
    }

    /// Its options.
    pub fn options(&self) -> ShardOptions {
        self.options
    }

    /// Whether a run is in progress.
    pub fn is_running(&self) -> bool {
        self.run.is_some()
    }

    /// The shards this replica owns, with their terms, in shard order. A shard being handed
    /// over is no longer owned (its term ended).
    pub fn owned(&self) -> Vec<(Shard, TermId)> {
        self.run
            .as_ref()
            .map(|run| run.owned.iter().map(|(s, t)| (*s, *t)).collect())
            .unwrap_or_default()
    }

    /// The term of `shard`, when this replica owns it.
    pub fn term_of(&self, shard: Shard) -> Option<TermId> {
        self.run.as_ref()?.owned.get(&shard).copied()
    }

    /// The shards whose term ended for a handover while their lock is still held, waiting for
    /// their work.
    pub fn handing_over(&self) -> Vec<Shard> {
        self.run
            .as_ref()
            .map(|run| run.handing.keys().copied().collect())
            .unwrap_or_default()
    }

    /// This replica's member id, while its session is a member.
    pub fn member(&self) -> Option<MemberId> {
        match &self.run.as_ref()?.session {
            Session::Open(open) => Some(open.backend),
            _ => None,
        }
    }

    /// The last survey that proved this replica's locks (the who-owns-what view); kept after
    /// the run for status pages.
    pub fn last_survey(&self) -> Option<&Survey> {
        self.last_survey.as_ref()
    }

    /// The coarse state.
    pub fn phase(&self) -> ShardPhase {
        let Some(run) = &self.run else {
            return ShardPhase::Idle;
        };
        if run.stop.is_some() {
            return ShardPhase::Stopping;
        }
        match &run.session {
            Session::None => ShardPhase::Detached,
            Session::Acquiring { .. } => ShardPhase::Acquiring,
            Session::Registering { .. } => ShardPhase::Registering,
            Session::Open(open) if open.busy.is_some() => ShardPhase::Busy,
            Session::Open(_) => ShardPhase::Member,
        }
    }

    /// The next action to perform, in order.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<ShardAction<C>> {
        self.actions.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines().into_iter().map(|(at, _)| at).min()
    }

    /// Which deadline [`poll_timeout`](Self::poll_timeout) stands for.
    pub fn timeout_reason(&self) -> Option<ShardTimer> {
        self.deadlines()
            .into_iter()
            .min_by_key(|(at, _)| *at)
            .map(|(_, why)| why)
    }

    fn deadlines(&self) -> Vec<(Instant, ShardTimer)> {
        let Some(run) = &self.run else {
            return Vec::new();
        };
        let mut all = Vec::new();
        match &run.session {
            Session::Acquiring { deadline, .. } => {
                all.push((*deadline, ShardTimer::AcquireDeadline))
            }
            Session::Registering { deadline, .. } => {
                all.push((*deadline, ShardTimer::StatementDeadline));
            }
            Session::Open(Open {
                busy: Some((_, deadline)),
                ..
            }) => all.push((*deadline, ShardTimer::StatementDeadline)),
            _ => {}
        }
        if let Some(stop) = &run.stop
            && !stop.awaiting.is_empty()
        {
            all.push((stop.deadline, ShardTimer::DrainDeadline));
        }
        if let Some(at) = run
            .handing
            .values()
            .filter(|h| !h.drained && !h.warned)
            .map(|h| h.overdue_at)
            .min()
        {
            all.push((at, ShardTimer::HandoverOverdue));
        }
        if let Some(at) = run.next_check {
            all.push((at, ShardTimer::NextCheck));
        }
        all
    }

    /// Starts a run at `now`: the first check is due at once.
    ///
    /// # Errors
    /// [`AlreadyRunning`] while a run is in progress.
    pub fn start(&mut self, now: Instant) -> Result<(), AlreadyRunning> {
        if self.run.is_some() {
            return Err(AlreadyRunning);
        }
        self.run = Some(Run {
            schedule: Schedule::starting_at(now, self.options.interval().get()),
            next_check: Some(now),
            session: Session::None,
            owned: BTreeMap::new(),
            handing: BTreeMap::new(),
            release: BTreeSet::new(),
            pending_take: Vec::new(),
            members: Vec::new(),
            members_since: now,
            stop: None,
        });
        self.check(now);
        Ok(())
    }

    /// Fires every deadline due at `now`. Calling it early or twice does nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Each deadline fires at most once per call; the order is the one of `deadlines`.
        for _ in 0..MAX_FIRES {
            let due = self
                .deadlines()
                .into_iter()
                .filter(|(at, _)| *at <= now)
                .min_by_key(|(at, _)| *at);
            let Some((_, why)) = due else {
                return;
            };
            match why {
                ShardTimer::AcquireDeadline => self.acquire_timed_out(now),
                ShardTimer::StatementDeadline => self.statement_timed_out(now),
                ShardTimer::DrainDeadline => self.drain_timed_out(now),
                ShardTimer::HandoverOverdue => self.handover_overdue(now),
                ShardTimer::NextCheck => self.check(now),
            }
        }
    }

    /// Applies one event at `now`.
    pub fn handle_event(&mut self, now: Instant, event: ShardEvent<C>) -> Handled {
        let Some(run) = &self.run else {
            return Handled::Ignored(Ignored::NotRunning);
        };
        if let Some(conn) = event.conn()
            && run.conn() != Some(conn)
        {
            return Handled::Ignored(Ignored::StaleConnection);
        }
        match event {
            ShardEvent::Acquired { .. } => self.acquired(now),
            ShardEvent::AcquireFailed { cause, .. } => self.acquire_failed(Cause::Error(cause)),
            ShardEvent::Registered {
                backend,
                granted,
                lock_capacity,
                members,
                ..
            } => self.registered(now, backend, granted, lock_capacity, members),
            ShardEvent::Surveyed { survey, .. } => self.surveyed(now, survey),
            ShardEvent::Took { granted, .. } => self.took(now, granted),
            ShardEvent::EpochsAdvanced { epochs, .. } => self.epochs_advanced(now, &epochs),
            ShardEvent::Unlocked { not_held, .. } => self.unlocked(now, not_held),
            ShardEvent::UnlockedAll { .. } => self.unlocked_all(),
            ShardEvent::StatementFailed {
                cause,
                session_ended,
                ..
            } => self.statement_failed(now, cause, session_ended),
            ShardEvent::SessionEnded { .. } => {
                self.lose(now, LossReason::SessionEnded, None);
                Handled::Applied
            }
            ShardEvent::WorkDrained { term } => self.work_drained(now, term),
            ShardEvent::Cancelled => self.cancelled(now),
            ShardEvent::Panicked => self.abandon(LossReason::Panicked),
            ShardEvent::Dropped => self.abandon(LossReason::Dropped),
        }
    }

    fn run(&mut self) -> &mut Run {
        self.run.as_mut().expect("called only while running")
    }

    fn next_conn(&mut self) -> ConnId {
        self.last_conn += 1;
        ConnId::new(self.last_conn)
    }

    fn next_term(&mut self) -> TermId {
        self.last_term += 1;
        TermId::new(self.last_term)
    }

    fn log(&mut self, log: ShardLog<C>) {
        self.actions.push_back(ShardAction::Log(log));
    }

    fn check(&mut self, now: Instant) {
        let interval = self.options.interval().get();
        let run = self.run();
        run.schedule.begin(now);
        run.next_check = Some(run.schedule.next_after(now));
        match &mut run.session {
            Session::None => {
                let conn = self.next_conn();
                self.run().session = Session::Acquiring {
                    conn,
                    deadline: now + interval,
                };
                self.actions.push_back(ShardAction::AcquireSession { conn });
            }
            Session::Open(open) => {
                open.survey_due = true;
                self.pump(now);
            }
            Session::Acquiring { .. } | Session::Registering { .. } => {}
        }
    }

    fn acquired(&mut self, now: Instant) -> Handled {
        let interval = self.options.interval();
        let run = self.run();
        let Session::Acquiring { conn, .. } = run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        run.session = Session::Registering {
            conn,
            deadline: now + interval.get(),
        };
        self.actions.push_back(ShardAction::Register {
            conn,
            idle_session_timeout_ms: interval.idle_session_timeout_millis(),
        });
        Handled::Applied
    }

    fn acquire_failed(&mut self, cause: Cause<C>) -> Handled {
        let run = self.run();
        if !matches!(run.session, Session::Acquiring { .. }) {
            return Handled::Ignored(Ignored::Unexpected);
        }
        run.session = Session::None;
        let mut log = ShardLog::new(ShardLogKind::AcquireFailed, 0);
        log.cause = Some(cause);
        self.log(log);
        Handled::Applied
    }

    fn acquire_timed_out(&mut self, _now: Instant) {
        let interval = self.options.interval().get();
        let run = self.run();
        let Session::Acquiring { conn, .. } = run.session else {
            return;
        };
        run.session = Session::None;
        self.actions.push_back(ShardAction::CloseSession { conn });
        let mut log = ShardLog::new(ShardLogKind::AcquireFailed, 0);
        log.cause = Some(Cause::TimedOut(interval));
        self.log(log);
    }

    fn registered(
        &mut self,
        now: Instant,
        backend: MemberId,
        granted: bool,
        lock_capacity: u64,
        members: u32,
    ) -> Handled {
        let options = self.options;
        let run = self.run();
        let Session::Registering { conn, .. } = run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if !granted {
            run.session = Session::None;
            self.actions.push_back(ShardAction::CloseSession { conn });
            self.log(ShardLog::new(ShardLogKind::MemberLockRefused, 0));
            return Handled::Applied;
        }
        if let Err(too_small) = options.check_lock_table(lock_capacity, members) {
            self.actions.push_back(ShardAction::CloseSession { conn });
            self.actions.push_back(ShardAction::Fail(too_small));
            self.finish();
            return Handled::Applied;
        }
        run.session = Session::Open(Open {
            conn,
            backend,
            joined_at: run.schedule.current(),
            busy: None,
            survey_due: true,
        });
        self.actions
            .push_back(ShardAction::Detach { conn, backend });
        self.log(ShardLog::new(ShardLogKind::Joined, 0));
        self.pump(now);
        Handled::Applied
    }

    fn surveyed(&mut self, now: Instant, survey: Survey) -> Handled {
        let options = self.options;
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if !matches!(open.busy, Some((Op::Survey, _))) {
            return Handled::Ignored(Ignored::Unexpected);
        }
        open.busy = None;
        let backend = open.backend;
        let joined_at = open.joined_at;
        if survey.backend() != backend {
            self.lose(now, LossReason::BackendChanged, None);
            return Handled::Applied;
        }
        if run.stop.is_some() {
            // Stopping: the stopped shards' terms ended but their locks stay until their work
            // returned and every lock is released at once; nothing is taken or given any more.
            self.last_survey = Some(survey);
            self.pump(now);
            return Handled::Applied;
        }
        let believed: Vec<Shard> = run
            .owned
            .keys()
            .chain(run.handing.keys())
            .chain(&run.release)
            .copied()
            .collect();
        let mut believed = believed;
        believed.sort_unstable();
        if !survey.members().contains(&backend) || survey.held_by(backend) != believed {
            self.lose(now, LossReason::LockNotHeld, None);
            return Handled::Applied;
        }
        // Windows are measured from the grid time of the check, so that a window of one
        // interval ends exactly at the next check.
        let checked_at = run.schedule.current();
        if survey.members() != run.members.as_slice() {
            run.members = survey.members().to_vec();
            run.members_since = checked_at;
        }
        if run.stop.is_none() {
            let plan = super::plan(&survey, backend);
            if now >= run.members_since + options.delay() {
                let excess = plan.held.saturating_sub(plan.cap) as usize;
                let room = excess.saturating_sub(run.handing.len());
                let give: Vec<Shard> = plan
                    .give
                    .iter()
                    .copied()
                    .filter(|s| run.owned.contains_key(s))
                    .take(room.min(options.moves() as usize))
                    .collect();
                self.hand_over(now, &give);
            }
            let run = self.run();
            let cold = survey.held_count() == 0 && now < joined_at + options.delay();
            if !cold {
                run.pending_take = plan.take;
            }
        }
        self.last_survey = Some(survey);
        self.pump(now);
        Handled::Applied
    }

    fn hand_over(&mut self, now: Instant, shards: &[Shard]) {
        if shards.is_empty() {
            return;
        }
        let grace = self.options.handover();
        for &shard in shards {
            let run = self.run();
            let Some(term) = run.owned.remove(&shard) else {
                continue;
            };
            run.handing.insert(
                shard,
                Handover {
                    term,
                    overdue_at: now + grace,
                    drained: false,
                    warned: false,
                },
            );
            self.actions.push_back(ShardAction::EndTerm {
                shard,
                term,
                cause: TermEndCause::HandedOver,
            });
            self.actions.push_back(ShardAction::AwaitWork { term });
        }
        self.log(ShardLog::new(ShardLogKind::HandingOver, shards.len()));
    }

    fn took(&mut self, now: Instant, granted: Vec<Shard>) -> Handled {
        let options = self.options;
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let Some((Op::Take(asked), _)) = open.busy.take() else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let stopping = run.stop.is_some();
        let granted: Vec<Shard> = granted.into_iter().filter(|s| asked.contains(s)).collect();
        if stopping || granted.is_empty() {
            // Stopping: the release of every lock follows, and no term begins.
            self.pump(now);
            return Handled::Applied;
        }
        if options.is_fencing() {
            // Before anything else the session might run: the grant waits for its epochs.
            self.issue(Op::Fence(granted), now + options.interval().get());
            return Handled::Applied;
        }
        self.begin_terms(granted.into_iter().map(|shard| (shard, None)));
        self.pump(now);
        Handled::Applied
    }

    fn begin_terms(&mut self, shards: impl IntoIterator<Item = (Shard, Option<u64>)>) {
        let mut began = 0;
        for (shard, epoch) in shards {
            let term = self.next_term();
            self.run().owned.insert(shard, term);
            self.actions
                .push_back(ShardAction::BeginTerm { shard, term, epoch });
            began += 1;
        }
        if began > 0 {
            self.log(ShardLog::new(ShardLogKind::Took, began));
        }
    }

    fn epochs_advanced(&mut self, now: Instant, epochs: &[(Shard, u64)]) -> Handled {
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let Some((Op::Fence(asked), _)) = open.busy.take() else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if run.stop.is_some() {
            self.pump(now);
            return Handled::Applied;
        }
        let epoch_of = |shard: Shard| epochs.iter().find(|(s, _)| *s == shard).map(|e| e.1);
        let (fenced, unfenced): (Vec<Shard>, Vec<Shard>) =
            asked.iter().partition(|&&shard| epoch_of(shard).is_some());
        self.begin_terms(fenced.into_iter().map(|shard| (shard, epoch_of(shard))));
        if !unfenced.is_empty() {
            self.fencing_failed(unfenced, None);
        }
        self.pump(now);
        Handled::Applied
    }

    /// Granted shards whose epochs were not advanced: no term begins; their locks are released
    /// at the next chance and taken again at a later survey.
    fn fencing_failed(&mut self, shards: Vec<Shard>, cause: Option<Cause<C>>) {
        let mut log = ShardLog::new(ShardLogKind::FencingFailed, shards.len());
        log.cause = cause;
        self.run().release.extend(shards);
        self.log(log);
    }

    fn unlocked(&mut self, now: Instant, not_held: Vec<Shard>) -> Handled {
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let Some((Op::Unlock(shards), _)) = open.busy.take() else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let mut handed = 0;
        for shard in &shards {
            handed += usize::from(run.handing.remove(shard).is_some());
            run.release.remove(shard);
        }
        // While stopping, the release of every lock follows once the work returned: a lock
        // found missing changes nothing of that.
        if !not_held.is_empty() && run.stop.is_none() {
            self.lose(now, LossReason::LockNotHeld, Some(Cause::LockNotHeld));
            return Handled::Applied;
        }
        if handed > 0 {
            self.log(ShardLog::new(ShardLogKind::HandedOver, handed));
        }
        self.pump(now);
        Handled::Applied
    }

    fn unlocked_all(&mut self) -> Handled {
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if !matches!(open.busy, Some((Op::UnlockAll, _))) {
            return Handled::Ignored(Ignored::Unexpected);
        }
        let conn = open.conn;
        self.actions.push_back(ShardAction::CloseSession { conn });
        self.finish();
        Handled::Applied
    }

    fn statement_failed(&mut self, now: Instant, cause: C, session_ended: bool) -> Handled {
        let run = self.run();
        match &run.session {
            Session::Registering { .. } => {}
            Session::Open(open) if open.busy.is_some() => {}
            _ => return Handled::Ignored(Ignored::Unexpected),
        }
        if self.releasing() {
            self.release_failed(Cause::Error(cause));
            return Handled::Applied;
        }
        if !session_ended && let Some(asked) = self.fencing() {
            // The grant stands, the epochs do not: release those shards, keep the session.
            self.fencing_failed(asked, Some(Cause::Error(cause)));
            self.pump(now);
            return Handled::Applied;
        }
        let reason = if session_ended {
            LossReason::SessionEnded
        } else {
            LossReason::CheckFailed
        };
        self.lose(now, reason, Some(Cause::Error(cause)));
        Handled::Applied
    }

    fn statement_timed_out(&mut self, now: Instant) {
        if self.releasing() {
            self.release_failed(Cause::TimedOut(UNLOCK_BUDGET));
            return;
        }
        let interval = self.options.interval().get();
        self.lose(
            now,
            LossReason::CheckTimedOut,
            Some(Cause::TimedOut(interval)),
        );
    }

    /// The shards of the fencing statement in flight, taken out of it.
    fn fencing(&mut self) -> Option<Vec<Shard>> {
        let Session::Open(open) = &mut self.run().session else {
            return None;
        };
        match open.busy.take() {
            Some((Op::Fence(asked), _)) => Some(asked),
            other => {
                open.busy = other;
                None
            }
        }
    }

    fn releasing(&mut self) -> bool {
        matches!(
            &self.run().session,
            Session::Open(Open {
                busy: Some((Op::UnlockAll, _)),
                ..
            })
        )
    }

    fn release_failed(&mut self, cause: Cause<C>) {
        if let Some(conn) = self.run().conn() {
            self.actions.push_back(ShardAction::CloseSession { conn });
        }
        let mut log = ShardLog::new(ShardLogKind::ReleaseFailed, 0);
        log.cause = Some(cause);
        self.log(log);
        self.finish();
    }

    fn work_drained(&mut self, now: Instant, term: TermId) -> Handled {
        let run = self.run();
        let mut applied = false;
        if let Some(stop) = &mut run.stop {
            applied |= stop.awaiting.remove(&term);
        }
        if let Some(handover) = run.handing.values_mut().find(|h| h.term == term)
            && !handover.drained
        {
            handover.drained = true;
            applied = true;
        }
        if !applied {
            return Handled::Ignored(Ignored::Unexpected);
        }
        self.pump(now);
        Handled::Applied
    }

    fn handover_overdue(&mut self, now: Instant) {
        let run = self.run();
        let mut late = 0;
        for handover in run.handing.values_mut() {
            if !handover.drained && !handover.warned && handover.overdue_at <= now {
                handover.warned = true;
                late += 1;
            }
        }
        // Called at the earliest such deadline: at least one is late.
        self.log(ShardLog::new(ShardLogKind::HandoverOverdue, late));
    }

    fn drain_timed_out(&mut self, now: Instant) {
        let run = self.run();
        let Some(stop) = &mut run.stop else {
            return;
        };
        let late = stop.awaiting.len();
        stop.awaiting.clear();
        self.log(ShardLog::new(ShardLogKind::WorkOutlivedStop, late));
        self.pump(now);
    }

    fn cancelled(&mut self, now: Instant) -> Handled {
        let grace = self.options.grace();
        let run = self.run();
        if run.stop.is_some() {
            return Handled::Ignored(Ignored::AlreadyStopping);
        }
        run.next_check = None;
        run.pending_take.clear();
        match run.session {
            Session::None => {
                self.finish();
                return Handled::Applied;
            }
            Session::Acquiring { conn, .. } | Session::Registering { conn, .. } => {
                self.actions.push_back(ShardAction::CloseSession { conn });
                self.finish();
                return Handled::Applied;
            }
            Session::Open(_) => {}
        }
        // Handovers still waiting for their work were asked for it already.
        let mut awaiting: BTreeSet<TermId> = run
            .handing
            .values()
            .filter(|h| !h.drained)
            .map(|h| h.term)
            .collect();
        let owned = std::mem::take(&mut run.owned);
        for (&shard, &term) in &owned {
            awaiting.insert(term);
            self.actions.push_back(ShardAction::EndTerm {
                shard,
                term,
                cause: TermEndCause::Stopped,
            });
        }
        for &term in owned.values() {
            self.actions.push_back(ShardAction::AwaitWork { term });
        }
        self.run().stop = Some(Stop {
            deadline: now + grace,
            awaiting,
        });
        self.pump(now);
        Handled::Applied
    }

    fn abandon(&mut self, reason: LossReason) -> Handled {
        let run = self.run();
        run.next_check = None;
        let conn = run.conn();
        self.end_all(TermEndCause::Lost(reason));
        if let Some(conn) = conn {
            self.actions.push_back(ShardAction::CloseSession { conn });
        }
        let kind = if reason == LossReason::Panicked {
            ShardLogKind::AbandonedAfterPanic
        } else {
            ShardLogKind::AbandonedAfterDrop
        };
        self.log(ShardLog::new(kind, 0));
        self.finish();
        Handled::Applied
    }

    /// Ends every open term with `cause`; returns how many there were.
    fn end_all(&mut self, cause: TermEndCause) -> usize {
        let run = self.run();
        let owned = std::mem::take(&mut run.owned);
        run.handing.clear();
        run.release.clear();
        run.pending_take.clear();
        for (&shard, &term) in &owned {
            self.actions
                .push_back(ShardAction::EndTerm { shard, term, cause });
        }
        owned.len()
    }

    /// The session is lost: every shard's term ends, the session closes, and the next check
    /// opens a new one (a stopping run finishes instead).
    fn lose(&mut self, _now: Instant, reason: LossReason, cause: Option<Cause<C>>) {
        let conn = self.run().conn();
        let lost = self.end_all(TermEndCause::Lost(reason));
        let run = self.run();
        run.session = Session::None;
        run.members.clear();
        let stopping = run.stop.is_some();
        if let Some(conn) = conn {
            self.actions.push_back(ShardAction::CloseSession { conn });
        }
        let mut log = ShardLog::new(ShardLogKind::SessionLost, lost);
        log.reason = Some(TermEndCause::Lost(reason));
        log.cause = cause;
        self.log(log);
        if stopping {
            self.finish();
        }
    }

    /// Starts the next statement when the session is free: the final release when stopping,
    /// else the pending take, the drained handovers' unlock, then a due survey.
    fn pump(&mut self, now: Instant) {
        let interval = self.options.interval().get();
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return;
        };
        if open.busy.is_some() {
            return;
        }
        let (op, deadline) = if let Some(stop) = &run.stop {
            if !stop.awaiting.is_empty() {
                return;
            }
            (Op::UnlockAll, now + UNLOCK_BUDGET)
        } else if !run.pending_take.is_empty() {
            (
                Op::Take(std::mem::take(&mut run.pending_take)),
                now + interval,
            )
        } else if run.handing.values().any(|h| h.drained) || !run.release.is_empty() {
            let mut unlock: Vec<Shard> = run
                .handing
                .iter()
                .filter(|(_, h)| h.drained)
                .map(|(s, _)| *s)
                .chain(run.release.iter().copied())
                .collect();
            unlock.sort_unstable();
            (Op::Unlock(unlock), now + interval)
        } else if open.survey_due {
            open.survey_due = false;
            (Op::Survey, now + interval)
        } else {
            return;
        };
        self.issue(op, deadline);
    }

    /// Runs `op` on the open session, answered by `deadline`: the one place a statement starts.
    fn issue(&mut self, op: Op, deadline: Instant) {
        let lock_timeout_ms = self.options.interval().half_millis();
        let Session::Open(open) = &mut self.run().session else {
            return;
        };
        let conn = open.conn;
        open.busy = Some((op.clone(), deadline));
        self.actions.push_back(match op {
            Op::Survey => ShardAction::Survey { conn },
            Op::Take(shards) => ShardAction::Take { conn, shards },
            Op::Fence(shards) => ShardAction::AdvanceEpochs {
                conn,
                shards,
                lock_timeout_ms,
            },
            Op::Unlock(shards) => ShardAction::Unlock { conn, shards },
            Op::UnlockAll => ShardAction::UnlockAll { conn },
        });
    }

    fn finish(&mut self) {
        self.run = None;
        self.actions.push_back(ShardAction::Finish);
    }
}

impl Run {
    fn conn(&self) -> Option<ConnId> {
        match &self.session {
            Session::None => None,
            Session::Acquiring { conn, .. } | Session::Registering { conn, .. } => Some(*conn),
            Session::Open(open) => Some(open.conn),
        }
    }
}
