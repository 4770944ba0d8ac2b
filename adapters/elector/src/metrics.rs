//! The elector's metrics: the spec's unlabeled `plexsphere_background_leader` gauge, and the
//! per-key metrics beyond the spec (transitions, lock attempts, check latency, the last
//! successful check, the current term). They go to a Prometheus registry
//! ([`Config::registry`](crate::Config::registry), feature `prometheus`, on by default), to the
//! `metrics` crate's global recorder (`Config::metrics_facade`, feature `metrics`), to both, or
//! nowhere. The names, labels and help texts are the same on both; `docs/metrics.md` describes
//! each metric and gives alert rules.
//!
//! The gauge is for scrapers: a service that wants to know whether it leads calls
//! [`Elector::is_leader`](crate::Elector::is_leader), which reads the same fact in one call (an
//! atomic load of the flag written together with the gauge, from the same value), instead of
//! reading the gauge back from the registry.
//!
//! Inside the crate, one design serves both modes: the families in one table (`families.rs`),
//! one backend per exporter (`registry.rs`, `facade.rs`) behind one seam (`backend.rs`), and
//! each mode's metrics a struct of handles (`ElectionMetrics` here, `ShardMetrics` in
//! `sharded/metrics.rs`).

pub(crate) mod backend;
pub(crate) mod backends;
#[cfg(feature = "metrics")]
mod facade;
pub(crate) mod families;
#[cfg(feature = "prometheus")]
mod registry;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use plexsphere_leader_core::TermEndCause;

use self::backend::{By, Counter, Gauge, Histogram};
use self::backends::Backends;
use self::families::{election as family, overdue_action};
use crate::error::ConfigError;
use crate::key::LockKey;
use crate::trust::Trust;

/// The spec's gauge's name. It is for scrapers: in code,
/// [`Elector::is_leader`](crate::Elector::is_leader) reads the same fact in one call.
pub const LEADER_GAUGE_NAME: &str = "plexsphere_background_leader";

/// The spec's gauge's help text.
pub const LEADER_GAUGE_HELP: &str =
    "1 while this replica holds the background leader lock, 0 otherwise";

/// Gauge `{key}`: 1 while this replica leads the election of `key`, 0 otherwise.
pub const IS_LEADER: &str = "plexsphere_leader_is_leader";

/// Counter `{key, to, cause}`: leadership transitions, by the state entered and why.
pub const TRANSITIONS: &str = "plexsphere_leader_transitions_total";

/// Counter `{key, outcome}`: a standby's lock attempts (its checks), by outcome.
pub const LOCK_ATTEMPTS: &str = "plexsphere_leader_lock_attempts_total";

/// Histogram `{key, role}`: how long a check's statement took to answer.
pub const CHECK_DURATION: &str = "plexsphere_leader_check_duration_seconds";

/// Gauge `{key}`: unix time of the last check that answered (leader or standby).
pub const LAST_CHECK_SUCCESS: &str = "plexsphere_leader_last_check_success_timestamp_seconds";

/// Gauge `{key}`: unix time the current term began; 0 while not leading.
pub const TERM_START: &str = "plexsphere_leader_term_start_timestamp_seconds";

/// Gauge `{key}`: the current term's fencing epoch; 0 while not leading or without fencing.
pub const TERM_EPOCH: &str = "plexsphere_leader_term_epoch";

/// The buckets of [`CHECK_DURATION`], in seconds: 1 ms to 10 s, about three per decade.
pub const CHECK_DURATION_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Gauge `{key}`: 1 while this replica may lead ([`Elector::set_eligible`]), 0 while it is kept
/// out (a canary: an ineligible replica makes no checks) or unfit (the server refused its
/// fitness probe, [`Config::fitness_probe`](crate::Config::fitness_probe): it probes at every
/// check and makes no attempt until a probe passes).
///
/// [`Elector::set_eligible`]: crate::Elector::set_eligible
pub const ELIGIBLE: &str = "plexsphere_leader_eligible";

/// Counter `{key, action}`: leader work found still running a work deadline after its term
/// ended ([`Config::work_deadline`](crate::Config::work_deadline)); `action` is `reported` or
/// `aborted`.
pub const OVERDUE_WORK: &str = "plexsphere_leader_overdue_work_total";

/// A ranked replica's rank (`Config::version`): 1, labelled by `key`, `priority` and
/// `version`; no series while unranked.
pub const RANK_INFO: &str = "plexsphere_leader_rank_info";

/// 1 while this standby defers to a better-ranked live candidate (`Config::version`).
pub const DEFERRING: &str = "plexsphere_leader_deferring";

/// 1 while this replica's last survey found it older than the version floor
/// (`Config::version_floor`): it does not lead.
pub const BELOW_VERSION_FLOOR: &str = "plexsphere_leader_below_version_floor";

/// The `key` label value of the election of `key`: `"1886156915:1"` for the default key (the
/// key's `CLASSID:OBJID` form). Every per-key metric takes its `key` label from here.
pub fn key_label(key: LockKey) -> String {
    key.to_string()
}

/// Why leadership changed: the `to` and `cause` labels of [`TRANSITIONS`]. Closed: a term
/// began, or ended with the core's [`TermEndCause`], whose label is the `cause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Transition {
    /// A term began (the lock was granted, and the epoch advanced with fencing).
    Acquired,
    /// A term ended, for this cause.
    Ended(TermEndCause),
}

impl Transition {
    const ALL: [Self; 1 + TermEndCause::ALL.len()] = {
        let mut all = [Self::Acquired; 1 + TermEndCause::ALL.len()];
        let mut index = 0;
        while index < TermEndCause::ALL.len() {
            all[index + 1] = Self::Ended(TermEndCause::ALL[index]);
            index += 1;
        }
        all
    };

    /// The `to` label: the state entered.
    const fn to(self) -> &'static str {
        match self {
            Self::Acquired => "leader",
            Self::Ended(_) => "standby",
        }
    }

    /// The `cause` label.
    const fn cause(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Ended(cause) => cause.label(),
        }
    }
}

/// How a standby's lock attempt ended: the `outcome` label of [`LOCK_ATTEMPTS`]. Closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AttemptOutcome {
    /// The lock was granted.
    Granted,
    /// Another session holds the lock.
    Refused,
    /// The server is a hot standby.
    InRecovery,
    /// The session already held the lock: a transaction-mode pooler shares it.
    SharedSession,
    /// The grant statement did not answer in time.
    TimedOut,
    /// The grant statement failed.
    Error,
    /// This replica cannot do the leader's work: its session is read-only, or the server
    /// refused its fitness probe ([`Config::fitness_probe`](crate::Config::fitness_probe)).
    Unfit,
    /// No connection: the pool failed or did not hand one out in time.
    NoConnection,
}

impl AttemptOutcome {
    const ALL: [Self; 8] = [
        Self::Granted,
        Self::Refused,
        Self::InRecovery,
        Self::SharedSession,
        Self::TimedOut,
        Self::Error,
        Self::NoConnection,
        Self::Unfit,
    ];

    const fn label(self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Refused => "refused",
            Self::InRecovery => "in_recovery",
            Self::SharedSession => "shared_session",
            Self::TimedOut => "timed_out",
            Self::Error => "error",
            Self::NoConnection => "no_connection",
            Self::Unfit => "unfit",
        }
    }
}

/// Which check a latency belongs to: the `role` label of [`CHECK_DURATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum CheckRole {
    /// The leader's lock-verifying check.
    Leader,
    /// The standby's polling grant statement (a queued wait is not observed).
    Standby,
}

impl CheckRole {
    const ALL: [Self; 2] = [Self::Leader, Self::Standby];

    const fn label(self) -> &'static str {
        match self {
            Self::Leader => "leader",
            Self::Standby => "standby",
        }
    }
}

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// One election's metrics, on every configured backend. Every observation is a few atomic
/// operations per backend.
pub(crate) struct ElectionMetrics {
    /// The spec's unlabeled gauge, shared by every elector on a registry.
    leader: Gauge,
    is_leader: Gauge,
    term_start: Gauge,
    term_epoch: Gauge,
    last_check: Gauge,
    transitions: By<Transition, Counter>,
    attempts: By<AttemptOutcome, Counter>,
    check_duration: By<CheckRole, Histogram>,
    /// By whether the work was aborted.
    overdue: By<bool, Counter>,
    eligible: Gauge,
    deferring: Gauge,
    below_floor: Gauge,
    /// The backends, for the trust deadline.
    backends: Backends,
    /// This elector's `key` label.
    key: String,
}

impl ElectionMetrics {
    /// The metrics `config` asks for, every series of its key created; `None` when it asks
    /// for none.
    ///
    /// # Errors
    /// [`ConfigError::Metrics`] when the registry refuses the collectors.
    pub(crate) fn for_config(config: &crate::Config) -> Result<Option<Self>, ConfigError> {
        let key = key_label(config.key);
        let rank = config.rank()?;
        Backends::of(&config.common, family::ALL)?
            .map(|backends| {
                let metrics = Self::new(backends, &key)?;
                if let Some(rank) = rank {
                    let (priority, version) = (rank.priority.to_string(), rank.version.to_string());
                    metrics
                        .backends
                        .handle::<Gauge>(&family::RANK_INFO, &[&key, &priority, &version])?
                        .set(1.0);
                }
                Ok(metrics)
            })
            .transpose()
    }

    /// The metrics of the election of `key` on `backends`, every series created.
    ///
    /// # Errors
    /// [`ConfigError::Metrics`] when a registry refuses a series.
    pub(crate) fn new(backends: Backends, key: &str) -> Result<Self, ConfigError> {
        let gauge = |family| backends.handle(family, &[key]);
        Ok(Self {
            leader: backends.handle(&family::LEADER, &[])?,
            is_leader: gauge(&family::IS_LEADER)?,
            term_start: gauge(&family::TERM_START)?,
            term_epoch: gauge(&family::TERM_EPOCH)?,
            last_check: gauge(&family::LAST_CHECK)?,
            transitions: By::new(Transition::ALL, |t| {
                backends.handle(&family::TRANSITIONS, &[key, t.to(), t.cause()])
            })?,
            attempts: By::new(AttemptOutcome::ALL, |outcome| {
                backends.handle(&family::ATTEMPTS, &[key, outcome.label()])
            })?,
            check_duration: By::new(CheckRole::ALL, |role| {
                backends.handle(&family::CHECK_DURATION, &[key, role.label()])
            })?,
            overdue: By::new([false, true], |aborted| {
                backends.handle(&family::OVERDUE, &[key, overdue_action(aborted)])
            })?,
            eligible: gauge(&family::ELIGIBLE)?,
            deferring: gauge(&family::DEFERRING)?,
            below_floor: gauge(&family::BELOW_VERSION_FLOOR)?,
            backends,
            key: key.to_owned(),
        })
    }

    /// The spec's gauge: 1 while leading.
    pub(crate) fn leading(&self, leading: bool) {
        self.leader.flag(leading);
    }

    /// A term began with fencing `epoch`: is-leader 1, its start time and epoch, and the
    /// transition counted.
    pub(crate) fn term_began(&self, epoch: Option<u64>) {
        self.term_start.set(unix_seconds(SystemTime::now()));
        // An epoch above 2^53 loses precision as a float, as it would on any exporter.
        #[allow(clippy::cast_precision_loss, reason = "a metric value")]
        self.term_epoch.set(epoch.map_or(0.0, |epoch| epoch as f64));
        self.is_leader.set(1.0);
        self.transition(Transition::Acquired);
    }

    /// The term ended: is-leader, its start time and epoch go to 0 (the transition is counted
    /// apart, once its cause is known).
    pub(crate) fn term_ended(&self) {
        self.is_leader.set(0.0);
        self.term_start.set(0.0);
        self.term_epoch.set(0.0);
    }

    /// Counts one leadership transition.
    pub(crate) fn transition(&self, transition: Transition) {
        self.transitions.inc(transition);
    }

    /// Counts one lock attempt.
    pub(crate) fn attempt(&self, outcome: AttemptOutcome) {
        self.attempts.inc(outcome);
    }

    /// Observes how long a check's statement took.
    pub(crate) fn check_latency(&self, role: CheckRole, took: Duration) {
        if let Some(histogram) = self.check_duration.of(role) {
            histogram.observe(took);
        }
    }

    /// A check answered: its wall-clock time.
    pub(crate) fn check_succeeded(&self) {
        self.last_check.set(unix_seconds(SystemTime::now()));
    }

    /// The replica was made eligible to lead, or not.
    pub(crate) fn set_eligible(&self, eligible: bool) {
        self.eligible.flag(eligible);
    }

    /// Whether this standby defers to a better candidate, and whether it is below the version
    /// floor, as the election says after an input.
    pub(crate) fn preference(&self, deferring: bool, below_floor: bool) {
        self.deferring.flag(deferring);
        self.below_floor.flag(below_floor);
    }

    /// Work was found running past the work deadline; `aborted` when it was aborted.
    pub(crate) fn overdue_work(&self, aborted: bool) {
        self.overdue.inc(aborted);
    }

    /// The elector's trust deadline, which a backend read at scrape time compares with the
    /// clock then (a lease term past it is no leadership, whether or not the driver ran
    /// since).
    pub(crate) fn watch_trust(&self, trust: &Arc<Trust>) {
        self.backends.watch_trust(&self.key, trust);
    }
}
