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
    MemberId, Shard, ShardAction, ShardEvent, ShardFailure, ShardLog, ShardLogKind, ShardOptions,
    Survey,
};
use crate::cause::{Cause, LossReason, TermEndCause};
use crate::control::Control;
use crate::handled::{AlreadyRunning, Handled, Ignored};
use crate::ids::{ConnId, IdSource, TermId};
use crate::interval::UNLOCK_BUDGET;
use crate::liveness::StuckLeader;
use crate::overdue::{Overdue, OverdueBook};
use crate::schedule::Schedule;

mod lease;
mod mechanism;
mod ops;
mod session;
mod stop;
mod survey;

/// The sharded election of one replica: its member session, and the shards it owns.
///
/// The same contract as [`Election`](crate::Election): feed inputs stamped with a
/// non-decreasing `now`, drain [`poll_action`](Self::poll_action) after each, call
/// [`handle_timeout`](Self::handle_timeout) at [`poll_timeout`](Self::poll_timeout), echo each
/// action's [`ConnId`] in its completion.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardedElection<C> {
    options: ShardOptions,
    run: Option<Run>,
    actions: VecDeque<ShardAction<C>>,
    ids: IdSource,
    last_survey: Option<Survey>,
    /// Whether this replica may own shards (kept across runs).
    eligible: bool,
    /// Whether the last survey found this replica below the version floor (said once).
    below_floor: bool,
}

/// How many deadlines one [`ShardedElection::handle_timeout`] may fire: each kind at most once.
const MAX_FIRES: usize = 6;

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
    /// An ended term's work deadline passed ([`ShardOptions::work_deadline`]).
    WorkDeadline,
    /// Lease mechanism: the trust of the member's last successful renewal runs out: every
    /// shard is lost.
    TrustDeadline,
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

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
    /// A resign's hold-off: no session is opened before it.
    held_off_until: Option<Instant>,
    /// The work deadlines of ended terms.
    overdue: OverdueBook,
    /// Whether the exclusion proof passed (or none is asked for): until it does, a join proves
    /// first; a lost session clears it.
    proved: bool,
    /// Whether the last survey found this replica's part of the plan done (at its cap, nothing
    /// to give or take): a lease member surveys again only when the members change or it is
    /// not.
    settled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Session {
    None,
    /// Acquiring a session for `conn`, or (`proving`) running the exclusion proof.
    Acquiring {
        conn: ConnId,
        deadline: Instant,
        proving: bool,
    },
    /// Registering since `since` (the lease's trust counts from the registration's sending).
    Registering {
        conn: ConnId,
        since: Instant,
        deadline: Instant,
    },
    Open(Open),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Open {
    conn: ConnId,
    backend: MemberId,
    joined_at: Instant,
    /// When the session last proved this replica's locks: the registration, then each survey
    /// that showed its member lock and exactly the shards it believes it holds.
    verified_at: Instant,
    busy: Option<(Op, Instant)>,
    survey_due: bool,
    /// Whether a statement of this membership already took the join's step on the version
    /// floor (a lease's registration, or an advisory member's first survey that answered).
    joined_floor: bool,
    /// Lease mechanism: a renewal is due.
    renew_due: bool,
    /// Lease mechanism: a release failed; it is retried at the next check, not at once (a
    /// server out of reach would otherwise be asked again in a loop without pause).
    release_held_off: bool,
    /// Lease mechanism: until when the member's lease is trusted (its last success's sending
    /// plus the trust window); every shard is lost then.
    trusted_until: Option<Instant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Op {
    Survey,
    /// A lease renewal, sent at this instant.
    Renew(Instant),
    Take(Vec<Shard>),
    Fence(Vec<Shard>),
    Unlock(Vec<Shard>),
    UnlockAll,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Handover {
    term: TermId,
    overdue_at: Instant,
    drained: bool,
    warned: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Stop {
    deadline: Instant,
    awaiting: BTreeSet<TermId>,
    /// What follows the release: the run's end, or (a resign, an ineligible replica) a rejoin.
    then: AfterStop,
}

/// What a stop leads to once every lock is released and the session closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AfterStop {
    /// The run finishes.
    Finish,
    /// The run goes on without a session: it rejoins at the next check allowed (after the
    /// hold-off, once eligible).
    Rejoin,
}

impl<C> ShardedElection<C> {
    /// A sharded election with these options, not running.
    pub fn new(options: ShardOptions) -> Self {
        Self {
            options,
            run: None,
            actions: VecDeque::new(),
            ids: IdSource::default(),
            last_survey: None,
            eligible: true,
            below_floor: false,
        }
    }

    /// Whether this replica may own shards ([`Control::SetEligible`]); kept across runs.
    pub fn is_eligible(&self) -> bool {
        self.eligible
    }

    /// Whether the last survey found this ranked replica older than the version floor
    /// ([`ShardOptions::version_floor`]): it owns no shard.
    pub fn is_below_floor(&self) -> bool {
        self.below_floor
    }

    /// While a resign holds this replica out of the space: until when.
    pub fn held_off_until(&self) -> Option<Instant> {
        self.run.as_ref()?.held_off_until
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

    /// While this replica owns a shard: when its session last proved its locks (the
    /// registration, then each survey that showed its member lock and exactly the shards it
    /// believes it holds). `None` while it owns none.
    pub fn last_verified(&self) -> Option<Instant> {
        let run = self.run.as_ref()?;
        if run.owned.is_empty() {
            return None;
        }
        match &run.session {
            Session::Open(open) => Some(open.verified_at),
            _ => None,
        }
    }

    /// Lease mechanism: until when this replica may trust the shards it owns (its last
    /// successful renewal's sending plus the trust window); `None` while it owns none, and for
    /// advisory locks. A driver that publishes ownership compares it with the clock at every
    /// read, so a replica resumed after a pause trusts nothing before its driver ran.
    pub fn trust_deadline(&self) -> Option<Instant> {
        let run = self.run.as_ref()?;
        if run.owned.is_empty() {
            return None;
        }
        match &run.session {
            Session::Open(open) => open.trusted_until,
            _ => None,
        }
    }

    /// The stuck-owner verdict at `now`, as [`Election::stuck`](crate::Election::stuck): `Err`
    /// when this replica owns a shard but its last proof ([`last_verified`](Self::last_verified))
    /// is older than [`STUCK_AFTER_INTERVALS`](crate::STUCK_AFTER_INTERVALS) check intervals —
    /// nobody drove the election in time. A replica that owns no shard is never stuck.
    ///
    /// # Errors
    /// [`StuckLeader`] with the age of the last proof and the bound.
    pub fn stuck(&self, now: Instant) -> Result<(), StuckLeader> {
        match self.last_verified() {
            Some(verified_at) => {
                StuckLeader::verdict(verified_at, now, self.options.interval().get())
            }
            None => Ok(()),
        }
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
        if let Some(at) = run.overdue.next() {
            all.push((at, ShardTimer::WorkDeadline));
        }
        if let Some(at) = run.next_check {
            all.push((at, ShardTimer::NextCheck));
        }
        if let Session::Open(Open {
            trusted_until: Some(at),
            ..
        }) = &run.session
        {
            all.push((*at, ShardTimer::TrustDeadline));
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
            held_off_until: None,
            overdue: OverdueBook::default(),
            settled: false,
            proved: !self.options.proves_pool(),
        });
        self.check(now);
        Ok(())
    }

    /// Fires every deadline due at `now`. Calling it early or twice does nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Each deadline fires at most once per call, and each work deadline that passed; the
        // order is the one of `deadlines`.
        let overdue = self.run.as_ref().map_or(0, |run| run.overdue.len());
        for _ in 0..MAX_FIRES + overdue {
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
                ShardTimer::WorkDeadline => self.report_overdue(),
                ShardTimer::TrustDeadline => self.trust_ran_out(now),
            }
        }
    }

    /// Applies one event at `now`.
    pub fn handle_event(&mut self, now: Instant, event: ShardEvent<C>) -> Handled {
        if let ShardEvent::Control(Control::SetEligible { eligible }) = event
            && self.run.is_none()
        {
            return self.keep_eligibility(eligible);
        }
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
            ShardEvent::PoolProbed { proof, .. } => self.pool_probed(now, proof),
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
            ShardEvent::Renewed {
                renewed, members, ..
            } => self.renewed(now, renewed, members),
            ShardEvent::TookLeases { live, taken, .. } => self.took_leases(now, live, &taken),
            ShardEvent::EpochsAdvanced { epochs, .. } => self.epochs_advanced(now, &epochs),
            ShardEvent::Unlocked { not_held, .. } => self.unlocked(now, not_held),
            ShardEvent::UnlockedAll { .. } => self.unlocked_all(now),
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
            ShardEvent::Control(control) => self.on_control(now, control),
        }
    }

    fn run(&mut self) -> &mut Run {
        self.run.as_mut().expect("called only while running")
    }

    fn next_conn(&mut self) -> ConnId {
        self.ids.next_conn()
    }

    fn next_term(&mut self) -> TermId {
        self.ids.next_term()
    }

    fn log(&mut self, log: ShardLog<C>) {
        self.actions.push_back(ShardAction::Log(log));
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
