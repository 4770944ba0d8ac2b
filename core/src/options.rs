//! The options of an election beyond its check interval: how a standby waits for the lock, how
//! long a graceful stop waits for leader work, and fencing epochs.

use std::fmt;
use std::time::Duration;

use crate::interval::CheckInterval;
use crate::lease::Lease;
use crate::rank::Rank;

/// How a standby asks for the lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AcquireMode {
    /// The spec's behaviour: try the lock once per check interval (`pg_try_advisory_lock`). A
    /// standby notices a released lock at its next check, up to one interval later.
    #[default]
    Poll,
    /// Wait in the server's lock queue (`pg_advisory_lock` under a transaction-local
    /// `lock_timeout` of one interval, repeated), so a standby leads as soon as the lock is
    /// released. Costs one busy backend per standby; see the reference documentation.
    Queue,
}

/// What happens to leader work still running a [work deadline](Options::work_deadline) after
/// its term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnOverdue {
    /// Report it (the driver logs it at WARN, naming the work, and counts it); the work runs on.
    Report,
    /// Report it, then abort what the driver can abort (work it started itself).
    Abort,
}

/// A hard deadline for leader work after its term ended ([`Options::work_deadline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkDeadline {
    /// How long after its term ended work may still run.
    pub after: Duration,
    /// What happens to work that does.
    pub on_overdue: OnOverdue,
}

impl WorkDeadline {
    /// A deadline `after` the end of a term, at most [`MAX_HOLD_OFF`](crate::MAX_HOLD_OFF)
    /// (7 days; longer is shortened to it).
    pub fn new(after: Duration, on_overdue: OnOverdue) -> Self {
        Self {
            after: after.min(crate::MAX_HOLD_OFF),
            on_overdue,
        }
    }
}

/// The validated options of one [`Election`](crate::Election).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Options {
    interval: CheckInterval,
    acquire: AcquireMode,
    stop_grace: Duration,
    fencing: bool,
    eligible: bool,
    work_deadline: Option<WorkDeadline>,
    lease: Option<Lease>,
    prove_pool: bool,
    probe_fitness: bool,
    rank: Option<Rank>,
    preempt_window: Option<Duration>,
    version_floor: bool,
    below_floor: bool,
}

/// The default stabilization window of a preference ([`Options::preempt_window`]), in check
/// intervals.
pub const PREEMPT_WINDOW_INTERVALS: u32 = 2;

/// How many check intervals a graceful stop may wait for leader work at most: the lock session
/// is idle meanwhile, and one check interval plus the grace must stay well inside the
/// `idle_session_timeout` of four intervals.
pub const MAX_STOP_GRACE_INTERVALS: u32 = 2;

impl Options {
    /// The spec's behaviour with `interval`: polling, a stop grace of one interval, no fencing.
    pub fn new(interval: CheckInterval) -> Self {
        Self {
            interval,
            acquire: AcquireMode::Poll,
            stop_grace: interval.get(),
            fencing: false,
            eligible: true,
            work_deadline: None,
            lease: None,
            prove_pool: false,
            probe_fitness: false,
            rank: None,
            preempt_window: None,
            version_floor: false,
            below_floor: false,
        }
    }

    /// Ranks this replica among the candidates ([`crate::rank`]): before each attempt a
    /// standby publishes its rank and surveys the others'
    /// ([`Action::SurveyCandidates`](crate::Action::SurveyCandidates)), and defers while a
    /// better-ranked one is live, so that a queued grant goes to the best; after each check
    /// that proved its hold the leader surveys them too, and once the best candidate outranks
    /// it and has been live for the [window](Self::preempt_window) (and the leader has led
    /// that long), the leader gives its term up
    /// ([`TermEndCause::Yielded`](crate::TermEndCause::Yielded)) and stays a standby. Unset
    /// (the default): no survey, today's behaviour exactly.
    #[must_use]
    pub fn preference(mut self, rank: Rank) -> Self {
        self.rank = Some(rank);
        self
    }

    /// The rank this replica runs with, when it has one ([`preference`](Self::preference)).
    pub fn rank_of(&self) -> Option<Rank> {
        self.rank
    }

    /// The stabilization window `W` of a [preference](Self::preference): a better candidate
    /// must have been live this long before the leader yields to it, and a leader leads at
    /// least this long before it yields (so leadership moves at most once per window). Default
    /// [`PREEMPT_WINDOW_INTERVALS`] check intervals; zero is taken as the default.
    #[must_use]
    pub fn preempt_window(mut self, window: Duration) -> Self {
        self.preempt_window = (!window.is_zero()).then_some(window);
        self
    }

    /// The stabilization window in force ([`preempt_window`](Self::preempt_window)).
    pub fn preempt_window_of(&self) -> Duration {
        self.preempt_window
            .unwrap_or(self.interval.get() * PREEMPT_WINDOW_INTERVALS)
    }

    /// The version floor of a [preference](Self::preference) (off by default): every leader
    /// records its version as the floor when it is newer than the one recorded, and a replica
    /// older than the floor makes no attempt (it says so once, at WARN, with both versions),
    /// so that a rollback cannot elect an older binary unless it is
    /// [allowed](Self::below_floor).
    #[must_use]
    pub fn version_floor(mut self, on: bool) -> Self {
        self.version_floor = on;
        self
    }

    /// A deliberate rollback: with the [floor](Self::version_floor) on, this replica leads even
    /// below the floor, and sets the floor to its own version once it leads.
    #[must_use]
    pub fn below_floor(mut self, allowed: bool) -> Self {
        self.below_floor = allowed;
        self
    }

    /// What this election's surveys do with the floor: standbys read it, leaders raise it (or,
    /// [allowed below it](Self::below_floor), set it); [`FloorStep::Off`](crate::rank::FloorStep::Off)
    /// without a rank or a floor.
    pub fn floor_step(&self, leading: bool) -> crate::rank::FloorStep {
        use crate::rank::FloorStep;
        match (self.rank, self.version_floor, leading) {
            (Some(_), true, false) => FloorStep::Read,
            (Some(rank), true, true) if self.below_floor => FloorStep::Set(rank.version),
            (Some(rank), true, true) => FloorStep::Raise(rank.version),
            _ => FloorStep::Off,
        }
    }

    /// Whether this replica may lead below the floor ([`below_floor`](Self::below_floor)).
    pub fn may_lead_below_floor(&self) -> bool {
        self.below_floor
    }

    /// How long a standby defers to a better candidate that does not take the lock: the
    /// window and two intervals more of that candidate's liveness (one that restarted gets the
    /// whole limit again), after which it tries the lock again, so a candidate that publishes
    /// but cannot lead never leaves the election without a leader. Past the limit it only
    /// tries (`TryLock`, even in [`AcquireMode::Queue`]): it catches a free lock but never
    /// waits in the queue ahead of the better candidate, whose queued wait wins the release.
    pub fn defer_limit(&self) -> Duration {
        self.preempt_window_of() + self.interval.get() * 2
    }

    /// Advisory lock: before the first grant of every run, prove that the pool's sessions are
    /// its own ([`Action::ProbePool`](crate::Action::ProbePool)): two pooled connections held
    /// at once must be answered by two server backends. A transaction- or statement-mode
    /// pooler that runs both on one server session is found before any term, and the run
    /// fails with [`Action::Fail`](crate::Action::Fail) instead of leading on a session it
    /// shares. Off by default here (the spec's Run has no such step); the `plexsphere-leader`
    /// adapter turns it on. No effect with a lease.
    #[must_use]
    pub fn prove_pool(mut self, on: bool) -> Self {
        self.prove_pool = on;
        self
    }

    /// Whether a run proves its pool before its first grant ([`prove_pool`](Self::prove_pool)).
    pub fn proves_pool(&self) -> bool {
        self.prove_pool && self.lease.is_none()
    }

    /// Probes whether this replica can do the leader's work
    /// ([`Action::ProbeFitness`](crate::Action::ProbeFitness)) before each attempt to take the
    /// lock or lease, and after each of the leader's checks that proved it. A replica whose
    /// probe the server refuses is unfit: it makes no attempt until a probe passes, and a
    /// leader found unfit gives its term up ([`TermEndCause::Unfit`](crate::TermEndCause::Unfit))
    /// and stays a standby. Off by default (the spec's Run has no such step); the
    /// `plexsphere-leader` adapter turns it on when the service names a probe.
    #[must_use]
    pub fn probe_fitness(mut self, on: bool) -> Self {
        self.probe_fitness = on;
        self
    }

    /// Whether the election probes its fitness ([`probe_fitness`](Self::probe_fitness)).
    pub fn probes_fitness(&self) -> bool {
        self.probe_fitness
    }

    /// Holds a lease row instead of the session advisory lock: the mechanism for a
    /// transaction-mode pooler ([`crate::lease`]). Every term then has the lease's epoch as
    /// its fencing epoch, so [`fencing`](Self::fencing) and the
    /// [acquire mode](Self::acquire) do not apply.
    #[must_use]
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The lease's terms when the election holds a lease; `None` for the advisory lock.
    pub fn lease_of(&self) -> Option<Lease> {
        self.lease
    }

    /// A hard deadline for leader work: `after` a term ended (for any reason), the election
    /// asks the driver to report work of that term still running, and with
    /// [`OnOverdue::Abort`] to abort it ([`Action::ReportOverdueWork`](crate::Action::ReportOverdueWork)).
    /// When the run finishes first (a graceful stop), the report comes as it finishes, since
    /// nothing drives the election afterwards. `after` is at most
    /// [`MAX_HOLD_OFF`](crate::MAX_HOLD_OFF) (7 days); longer is shortened to it.
    #[must_use]
    pub fn work_deadline(mut self, after: Duration, on_overdue: OnOverdue) -> Self {
        self.work_deadline = Some(WorkDeadline::new(after, on_overdue));
        self
    }

    /// The work deadline, if any.
    pub fn work_deadline_of(&self) -> Option<WorkDeadline> {
        self.work_deadline
    }

    /// How a standby asks for the lock.
    #[must_use]
    pub fn acquire(mut self, mode: AcquireMode) -> Self {
        self.acquire = mode;
        self
    }

    /// How long a graceful stop waits, after the term ended, for leader work to return before it
    /// unlocks. Zero unlocks at once.
    ///
    /// # Errors
    /// [`StopGraceTooLong`] above [`MAX_STOP_GRACE_INTERVALS`] check intervals.
    pub fn stop_grace(mut self, grace: Duration) -> Result<Self, StopGraceTooLong> {
        let max = self.max_stop_grace();
        if grace > max {
            return Err(StopGraceTooLong { given: grace, max });
        }
        self.stop_grace = grace;
        Ok(self)
    }

    /// Whether every term gets a fencing epoch from the database before it begins.
    #[must_use]
    pub fn fencing(mut self, enabled: bool) -> Self {
        self.fencing = enabled;
        self
    }

    /// Whether the replica may lead when the election is created (default `true`); changed
    /// later with [`Control::SetEligible`](crate::Control::SetEligible). An ineligible replica
    /// never tries the lock.
    #[must_use]
    pub fn eligible(mut self, eligible: bool) -> Self {
        self.eligible = eligible;
        self
    }

    /// Whether the replica may lead when the election is created.
    pub fn is_eligible(&self) -> bool {
        self.eligible
    }

    /// The check interval.
    pub fn interval(&self) -> CheckInterval {
        self.interval
    }

    /// The acquire mode.
    pub fn acquire_mode(&self) -> AcquireMode {
        self.acquire
    }

    /// The stop grace.
    pub fn grace(&self) -> Duration {
        self.stop_grace
    }

    /// Whether fencing is on.
    pub fn is_fencing(&self) -> bool {
        self.fencing
    }

    /// The longest a graceful stop of a leader takes: the stop grace for its work, then the
    /// unlock's budget ([`UNLOCK_BUDGET`](crate::UNLOCK_BUDGET)). A standby stops at once.
    pub fn stop_budget(&self) -> Duration {
        self.stop_grace + crate::UNLOCK_BUDGET
    }

    /// The longest stop grace accepted with this interval.
    pub fn max_stop_grace(&self) -> Duration {
        self.interval.get() * MAX_STOP_GRACE_INTERVALS
    }

    /// How long the server may keep a queued standby waiting (`lock_timeout`): one interval.
    pub fn lock_timeout(&self) -> Duration {
        self.interval.get()
    }

    /// [`lock_timeout`](Self::lock_timeout) in whole milliseconds, as PostgreSQL's
    /// `lock_timeout` takes it: rounded up (never shorter than the interval), at least 1, at
    /// most `i32::MAX`.
    pub fn lock_timeout_millis(&self) -> u32 {
        crate::interval::timeout_millis(self.lock_timeout())
    }

    /// How long the election waits for a queued grant statement to answer: the `lock_timeout`
    /// plus one interval for the round trip, so the server's timeout always comes first.
    pub fn queued_grant_budget(&self) -> Duration {
        self.lock_timeout() + self.interval.get()
    }
}

/// [`Options::stop_grace`] was given more than [`MAX_STOP_GRACE_INTERVALS`] check intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopGraceTooLong {
    /// The grace asked for.
    pub given: Duration,
    /// The longest accepted.
    pub max: Duration,
}

impl fmt::Display for StopGraceTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stop grace {:?} is longer than {MAX_STOP_GRACE_INTERVALS} check intervals ({:?}): \
             the idle lock session would outlive its idle_session_timeout",
            self.given, self.max
        )
    }
}

impl std::error::Error for StopGraceTooLong {}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(ms: u64) -> CheckInterval {
        CheckInterval::new(Duration::from_millis(ms)).unwrap()
    }

    #[test]
    fn defaults_are_the_spec_behaviour_with_a_grace_of_one_interval() {
        let options = Options::new(interval(200));
        assert_eq!(options.acquire_mode(), AcquireMode::Poll);
        assert_eq!(options.grace(), Duration::from_millis(200));
        assert!(!options.is_fencing());
        assert!(options.is_eligible());
        assert!(!options.eligible(false).is_eligible());
    }

    #[test]
    fn the_grace_is_bounded_by_two_intervals() {
        let options = Options::new(interval(200));
        assert!(options.stop_grace(Duration::from_millis(400)).is_ok());
        assert!(options.stop_grace(Duration::ZERO).is_ok());
        assert_eq!(
            options.stop_budget(),
            Duration::from_millis(200) + crate::UNLOCK_BUDGET
        );
        let no_grace = options.stop_grace(Duration::ZERO).unwrap();
        assert_eq!(no_grace.stop_budget(), crate::UNLOCK_BUDGET);
        let error = options.stop_grace(Duration::from_millis(401)).unwrap_err();
        assert_eq!(error.max, Duration::from_millis(400));
        assert!(
            error.to_string().contains("idle_session_timeout"),
            "{error}"
        );
    }

    #[test]
    fn a_queued_grant_is_given_one_interval_more_than_the_server_lock_timeout() {
        let options = Options::new(interval(200)).acquire(AcquireMode::Queue);
        assert_eq!(options.lock_timeout(), Duration::from_millis(200));
        assert_eq!(options.queued_grant_budget(), Duration::from_millis(400));
    }
}
