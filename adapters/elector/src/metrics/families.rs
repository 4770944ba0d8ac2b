//! The table of every metric family, for both modes and every backend: its name, help text,
//! kind (with a histogram's buckets) and label names. A backend builds its collectors, or
//! describes the families to its recorder, from this table only; `docs/metrics.md` says what
//! each one means and gives alert rules.
//!
//! Help texts: one sentence, no trailing period.

use super::{
    BELOW_VERSION_FLOOR, CHECK_DURATION, CHECK_DURATION_BUCKETS, DEFERRING, ELIGIBLE, IS_LEADER,
    LAST_CHECK_SUCCESS, LEADER_GAUGE_HELP, LEADER_GAUGE_NAME, LOCK_ATTEMPTS, OVERDUE_WORK,
    RANK_INFO, TERM_EPOCH, TERM_START, TRANSITIONS,
};

/// What kind of series a family has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Gauge,
    /// A gauge of leadership, 1 while leading: a backend read at scrape time reads a 1 whose
    /// electors' trust has run out as 0 (a lease leader paused past its trust).
    Leading,
    Counter,
    /// A histogram of seconds, with these buckets.
    Histogram(&'static [f64]),
}

/// One metric family: every series of it has a value for each of `labels`, in that order.
#[derive(Debug)]
#[cfg_attr(
    not(any(feature = "prometheus", feature = "metrics")),
    allow(dead_code, reason = "the backends read it")
)]
pub(crate) struct Family {
    pub(crate) name: &'static str,
    pub(crate) help: &'static str,
    pub(crate) kind: Kind,
    pub(crate) labels: &'static [&'static str],
}

const fn family(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Family {
    Family {
        name,
        help,
        kind,
        labels,
    }
}

/// The `action` label of the overdue-work counters of both modes.
pub(crate) const fn overdue_action(aborted: bool) -> &'static str {
    if aborted { "aborted" } else { "reported" }
}

/// One election's families: the spec's unlabeled gauge, and the rest by the election's `key`.
pub(crate) mod election {
    use super::{Family, Kind, family};

    pub(crate) const LEADER: Family = family(
        super::LEADER_GAUGE_NAME,
        Kind::Leading,
        &[],
        super::LEADER_GAUGE_HELP,
    );
    pub(crate) const IS_LEADER: Family = family(
        super::IS_LEADER,
        Kind::Leading,
        &["key"],
        "1 while this replica leads the election of key",
    );
    pub(crate) const TERM_START: Family = family(
        super::TERM_START,
        Kind::Gauge,
        &["key"],
        "Unix time the current term began; 0 while not leading",
    );
    pub(crate) const TERM_EPOCH: Family = family(
        super::TERM_EPOCH,
        Kind::Gauge,
        &["key"],
        "Fencing epoch of the current term; 0 while not leading or without fencing",
    );
    pub(crate) const LAST_CHECK: Family = family(
        super::LAST_CHECK_SUCCESS,
        Kind::Gauge,
        &["key"],
        "Unix time of the last check that answered: a leader's passed check, or a standby's \
         grant statement that granted or refused",
    );
    pub(crate) const TRANSITIONS: Family = family(
        super::TRANSITIONS,
        Kind::Counter,
        &["key", "to", "cause"],
        "Leadership transitions of this replica, by the state entered and the cause",
    );
    pub(crate) const ATTEMPTS: Family = family(
        super::LOCK_ATTEMPTS,
        Kind::Counter,
        &["key", "outcome"],
        "A standby's lock attempts, by outcome",
    );
    pub(crate) const CHECK_DURATION: Family = family(
        super::CHECK_DURATION,
        Kind::Histogram(&super::CHECK_DURATION_BUCKETS),
        &["key", "role"],
        "How long a check's statement took to answer, or to time out: the leader's \
         lock-verifying check and the standby's polling grant statement",
    );
    pub(crate) const OVERDUE: Family = family(
        super::OVERDUE_WORK,
        Kind::Counter,
        &["key", "action"],
        "Leader work still running a work deadline after its term ended, by what was done \
         about it (reported, or aborted)",
    );
    pub(crate) const ELIGIBLE: Family = family(
        super::ELIGIBLE,
        Kind::Gauge,
        &["key"],
        "1 while this replica may lead the election of key, 0 while it is kept out (it makes \
         no checks then)",
    );

    pub(crate) const RANK_INFO: Family = family(
        super::RANK_INFO,
        Kind::Gauge,
        &["key", "priority", "version"],
        "1, labelled with this replica's rank in the election of key (priority, then \
         version); no series while unranked",
    );
    pub(crate) const DEFERRING: Family = family(
        super::DEFERRING,
        Kind::Gauge,
        &["key"],
        "1 while this standby defers to a better-ranked live candidate of the election of key",
    );
    pub(crate) const BELOW_VERSION_FLOOR: Family = family(
        super::BELOW_VERSION_FLOOR,
        Kind::Gauge,
        &["key"],
        "1 while this replica is older than the newest version that has led the election of \
         key (the version floor): it does not lead",
    );

    /// Every family of one election.
    pub(crate) const ALL: &[&Family] = &[
        &LEADER,
        &IS_LEADER,
        &TERM_START,
        &TERM_EPOCH,
        &LAST_CHECK,
        &TRANSITIONS,
        &ATTEMPTS,
        &CHECK_DURATION,
        &OVERDUE,
        &ELIGIBLE,
        &RANK_INFO,
        &DEFERRING,
        &BELOW_VERSION_FLOOR,
    ];
}

/// A shard space's families, by the space's `class`: counts and histograms, never a series per
/// shard, so their cardinality does not grow with the space.
pub(crate) mod space {
    use super::{Family, Kind, family};

    pub(crate) const OWNED: Family = family(
        "plexsphere_shards_owned",
        Kind::Gauge,
        &["class"],
        "Shards this replica owns",
    );
    pub(crate) const MEMBERS: Family = family(
        "plexsphere_shards_members",
        Kind::Gauge,
        &["class"],
        "Members of the shard space at this replica's last survey",
    );
    pub(crate) const UNOWNED: Family = family(
        "plexsphere_shards_unowned",
        Kind::Gauge,
        &["class"],
        "Shards nobody held at this replica's last survey",
    );
    pub(crate) const ELIGIBLE: Family = family(
        "plexsphere_shards_eligible",
        Kind::Gauge,
        &["class"],
        "1 while this replica may own shards, 0 while the operator keeps it out",
    );
    pub(crate) const BELOW_FLOOR: Family = family(
        "plexsphere_shards_below_version_floor",
        Kind::Gauge,
        &["class"],
        "1 while this ranked replica's version is older than the space's version floor (it \
         owns no shard), else 0",
    );
    /// `event` is `began` (with an empty `cause`) or `ended` (with the end cause's label).
    pub(crate) const TERMS: Family = family(
        "plexsphere_shard_terms_total",
        Kind::Counter,
        &["class", "event", "cause"],
        "Shard terms begun and ended on this replica, by end cause",
    );
    pub(crate) const SURVEY: Family = family(
        "plexsphere_shards_survey_seconds",
        Kind::Histogram(&[
            0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
        ]),
        &["class"],
        "Time for the survey statement (the space's pg_locks rows, or a lease space's owner rows) to answer",
    );
    pub(crate) const OVERDUE: Family = family(
        "plexsphere_shards_overdue_work_total",
        Kind::Counter,
        &["class", "action"],
        "Shard work still running a work deadline after its shard term ended, by what was \
         done about it (reported, or aborted)",
    );

    /// Every family of a shard space.
    pub(crate) const ALL: &[&Family] = &[
        &OWNED,
        &MEMBERS,
        &UNOWNED,
        &ELIGIBLE,
        &BELOW_FLOOR,
        &TERMS,
        &SURVEY,
        &OVERDUE,
    ];
}
