//! What a run records: the harness's history (faults, replica lifetimes, terms of leadership)
//! and the trace, all in simulated time since the start of the run.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// The identity part of a lease holder `<identity> <nonce>`: the adapter draws the nonce from
/// the process's hasher keys and the wall clock, so it differs between the two runs of a seed
/// and stays out of the trace.
pub(crate) fn holder_identity(holder: &str) -> &str {
    holder
        .rsplit_once(' ')
        .map_or(holder, |(identity, _nonce)| identity)
}

/// The recorder shared by the harness and the replica hosts.
pub(crate) type SharedRecorder = Rc<RefCell<Recorder>>;

/// A half-open span of simulated time; `end` is `None` while it lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: Duration,
    pub(crate) end: Option<Duration>,
}

impl Span {
    pub(crate) fn open(start: Duration) -> Self {
        Self { start, end: None }
    }

    /// The end, or `until` while the span lasts.
    pub(crate) fn end_or(&self, until: Duration) -> Duration {
        self.end.unwrap_or(until)
    }

    /// Whether the span covers any instant of `[from, to]`.
    pub(crate) fn meets(&self, from: Duration, to: Duration) -> bool {
        self.start <= to && self.end.is_none_or(|end| end >= from)
    }
}

/// The part of the recorder the replica hosts write: units of leader work.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// The simulated time of the current step, as the harness last set it.
    pub(crate) now: Duration,
    /// Every unit of work on a lock of the space: leader work (the whole unit; in fencing runs
    /// only the hold between an accepted fence check and the commit) or a shard's work.
    pub(crate) work: Vec<Work>,
    /// Fencing runs: every fenced unit of work, as the service saw it.
    pub(crate) fenced: Vec<FencedWrite>,
}

/// One unit of work on a lock of the space, run in a term of that lock: leader work (lock 0)
/// or the work of shard `lock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Work {
    pub(crate) replica: usize,
    pub(crate) incarnation: u32,
    pub(crate) lock: u32,
    /// The term it ran in (the term `run_if_leader` or `run_if_owner` took).
    pub(crate) term: u64,
    pub(crate) span: Span,
}

/// How a fenced unit of work ended, as the service saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FenceOutcome {
    /// Still running when the run ended, or cut short by a crash of its host.
    Unfinished,
    /// The check found the term's epoch current and the transaction committed.
    Accepted,
    /// The check found a newer epoch; the transaction rolled back.
    Stale {
        /// The epoch the check read.
        current: u64,
    },
    /// Anything else: no connection, a server error, the budget exhausted (the connection is
    /// then closed, and the server may still have committed).
    Failed(String),
}

/// One fenced unit of work: `BEGIN`, the fence check, the work, `COMMIT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FencedWrite {
    pub(crate) replica: usize,
    pub(crate) incarnation: u32,
    /// The term's epoch it checked against.
    pub(crate) epoch: Option<u64>,
    pub(crate) started: Duration,
    /// When the check's answer came back.
    pub(crate) checked: Option<Duration>,
    /// When the commit's (or rollback's) answer came back, or the unit gave up.
    pub(crate) ended: Option<Duration>,
    pub(crate) outcome: FenceOutcome,
}

impl Recorder {
    /// A unit of `work` begins; returns its index for [`Recorder::end_work`].
    fn begin_work(&mut self, work: Work) -> usize {
        self.work.push(work);
        self.work.len() - 1
    }

    /// Unit `index` of work ended at `at`.
    fn end_work(&mut self, index: usize, at: Duration) {
        if let Some(work) = self.work.get_mut(index)
            && work.span.end.is_none()
        {
            work.span.end = Some(at);
        }
    }

    /// Ends every unit of work of `replica` still running (its host crashed).
    pub(crate) fn end_all_work(&mut self, replica: usize, at: Duration) {
        for work in &mut self.work {
            if work.replica == replica && work.span.end.is_none() {
                work.span.end = Some(at);
            }
        }
    }

    /// A fenced unit of work begins; returns its index for the calls below.
    pub(crate) fn begin_fenced(
        &mut self,
        replica: usize,
        incarnation: u32,
        epoch: Option<u64>,
        at: Duration,
    ) -> usize {
        self.fenced.push(FencedWrite {
            replica,
            incarnation,
            epoch,
            started: at,
            checked: None,
            ended: None,
            outcome: FenceOutcome::Unfinished,
        });
        self.fenced.len() - 1
    }

    /// The fence check of unit `index` answered.
    pub(crate) fn fence_checked(&mut self, index: usize, at: Duration) {
        if let Some(write) = self.fenced.get_mut(index) {
            write.checked = Some(at);
        }
    }

    /// Unit `index` ended with `outcome`.
    pub(crate) fn end_fenced(&mut self, index: usize, at: Duration, outcome: FenceOutcome) {
        if let Some(write) = self.fenced.get_mut(index) {
            write.ended = Some(at);
            write.outcome = outcome;
        }
    }
}

/// How a term ended, as the elector published it (`Leadership::last_end`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TermEnd {
    /// `TermEndCause::Stopped`: a graceful stop.
    Stopped,
    /// `TermEndCause::Lost(_)`: a failed check, a crash or a restart.
    Lost,
    /// `TermEndCause::Resigned`: an operator's resign, or the replica made ineligible.
    Resigned,
    /// `TermEndCause::HandedOver`: a shard given up for balance (sharded runs).
    HandedOver,
    /// `TermEndCause::Yielded`: a ranked leader yielded to a better candidate (rollout runs).
    Yielded,
    /// Still open when the run ended.
    Open,
}

/// One term on a lock of the run's space as the harness observed it, from what the replica's
/// elector published: a term of leadership (the single election is a space of one lock, lock
/// 0), or a term of shard `lock` (sharded runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TermRecord {
    pub(crate) replica: usize,
    pub(crate) incarnation: u32,
    /// The lock of the space: 0 for the single election, the shard in a sharded run.
    pub(crate) lock: u32,
    pub(crate) id: u64,
    /// The term's fencing epoch (`TermInfo::epoch`), read when it began (single election).
    pub(crate) epoch: Option<u64>,
    pub(crate) span: Span,
    pub(crate) end: TermEnd,
}

/// A shard whose term ended for a handover while its replica keeps the lock until the work
/// returned and the unlock ran (`Ownership::handing_over`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handing {
    pub(crate) replica: usize,
    pub(crate) incarnation: u32,
    pub(crate) shard: u32,
    pub(crate) span: Span,
}

/// A link fault between a replica and a server host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkFault {
    pub(crate) replica: usize,
    pub(crate) server: usize,
    pub(crate) span: Span,
    /// Whether messages are dropped (a partition): a TCP connection that loses a segment is
    /// wedged for good, as one the kernel retransmits on for minutes. A held link delivers
    /// everything on release.
    pub(crate) drops: bool,
}

/// A time in which one incarnation of a replica may not take the lock: an operator's resign
/// (its hold-off, counted from the request) or an ineligible spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldOut {
    pub(crate) replica: usize,
    pub(crate) incarnation: u32,
    pub(crate) span: Span,
}

/// One incarnation of a replica, from the harness's (re)start to its crash or stop request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UpSpan {
    pub(crate) replica: usize,
    pub(crate) span: Span,
}

/// The harness's history of a run.
#[derive(Debug, Default)]
pub(crate) struct History {
    /// Every term on a lock of the space, in the order they began (sharded runs: every shard
    /// term).
    pub(crate) terms: Vec<TermRecord>,
    /// Sharded runs: every shard being handed over, in the order the handovers began.
    pub(crate) handing: Vec<Handing>,
    /// Sharded runs: every advisory lock each server held when every replica was asked to
    /// stop (the end of the steady state), by server.
    pub(crate) locks_at_stop: Vec<Vec<plexsphere_leader_pgsim::HeldLock>>,
    pub(crate) up: Vec<UpSpan>,
    /// Every incarnation the harness saw start: (replica, incarnation, when), in time order.
    pub(crate) incarnations: Vec<(usize, u32, Duration)>,
    /// Rollout runs: the version each incarnation was ranked with, as `incarnations` lists
    /// them: (replica, incarnation, version).
    pub(crate) versions: Vec<(usize, u32, &'static str)>,
    /// Rollout runs: when the rollout asked each replica to stop for its upgrade: (replica,
    /// when).
    pub(crate) upgrades: Vec<(usize, Duration)>,
    pub(crate) link_faults: Vec<LinkFault>,
    /// Other events that disturb one replica's checks, such as the termination of one of its
    /// sessions (a check may be running on it): (replica, span).
    pub(crate) disturbances: Vec<(usize, Span)>,
    /// Query latency set on a server: (server, span).
    pub(crate) latency: Vec<(usize, Span)>,
    /// Which server is the primary from when: (since, server), in time order.
    pub(crate) primaries: Vec<(Duration, usize)>,
    /// Graceful stop requests: (replica, when).
    pub(crate) stop_requests: Vec<(usize, Duration)>,
    /// Resign requests, and requests that made a replica ineligible: (replica, when).
    pub(crate) resign_requests: Vec<(usize, Duration)>,
    /// When a replica may not take the lock: a resign's hold-off, counted from the request, or
    /// the time it was ineligible.
    pub(crate) held_out: Vec<HeldOut>,
    /// The pauses of a replica's process ([`crate::pause`]): (replica, span).
    pub(crate) pauses: Vec<(usize, Span)>,
    /// What a paused replica's `is_leader()` answered first when it resumed: (when, replica,
    /// the answer, whether it led when the pause began).
    pub(crate) resumes: Vec<(Duration, usize, bool, bool)>,
    /// The number of faults injected.
    pub(crate) faults: usize,
    /// When the faults stopped (the liveness phase began).
    pub(crate) faults_stopped: Option<Duration>,
    /// When the last replica was up again after the faults stopped.
    pub(crate) all_up: Option<Duration>,
    /// When every replica was asked to stop.
    pub(crate) stop_all: Option<Duration>,
    /// When the run ended.
    pub(crate) end: Duration,
    /// Problems seen while observing (an ERROR event of the adapter, `is_leader()` disagreeing
    /// with `current_term()`): (time, what).
    pub(crate) errors: Vec<(Duration, String)>,
    /// How many times a fitness run's unfit replica said that the server refused its probe.
    pub(crate) unfit_refusals: usize,
    /// Replicas whose last incarnation did not stop within the stop budget.
    pub(crate) unstopped: Vec<usize>,
    /// A host's software failed (returned an error or panicked): (time, what).
    pub(crate) host_failure: Option<(Duration, String)>,
    /// The readable trace: (time, who, what).
    pub(crate) trace: Vec<(Duration, String, String)>,
}

impl History {
    pub(crate) fn note(&mut self, at: Duration, who: impl Into<String>, what: impl Into<String>) {
        self.trace.push((at, who.into(), what.into()));
    }

    /// Whether `incarnation` is replica `replica`'s latest incarnation seen to start by `at`
    /// (a later one has not started yet).
    pub(crate) fn is_current(&self, replica: usize, incarnation: u32, at: Duration) -> bool {
        self.incarnations
            .iter()
            .rev()
            .find(|(r, _, started)| *r == replica && *started <= at)
            .is_some_and(|(_, current, _)| *current == incarnation)
    }

    /// The primary at time `at`.
    pub(crate) fn primary_at(&self, at: Duration) -> usize {
        self.primaries
            .iter()
            .take_while(|(since, _)| *since <= at)
            .last()
            .map_or(0, |(_, server)| *server)
    }
}

/// Records one unit of work from its start to its end (or to the crash that drops it).
pub(crate) struct WorkGuard {
    recorder: SharedRecorder,
    index: usize,
}

impl WorkGuard {
    /// Replica `replica`'s incarnation `incarnation` begins a unit of work on `lock` of the
    /// space, in its term `term`.
    pub(crate) fn begin(
        recorder: SharedRecorder,
        replica: usize,
        incarnation: u32,
        lock: u32,
        term: u64,
    ) -> Self {
        let at = sim_time(&recorder);
        let work = Work {
            replica,
            incarnation,
            lock,
            term,
            span: Span::open(at),
        };
        let index = recorder.borrow_mut().begin_work(work);
        Self { recorder, index }
    }
}

impl Drop for WorkGuard {
    fn drop(&mut self) {
        let at = sim_time(&self.recorder);
        if let Ok(mut recorder) = self.recorder.try_borrow_mut() {
            recorder.end_work(self.index, at);
        }
    }
}

/// The simulated time inside a host. While turmoil drops a crashed host's software no runtime
/// is entered and tokio would read the real clock, so the harness's time of the crash is used.
pub(crate) fn sim_time(recorder: &RefCell<Recorder>) -> Duration {
    let harness = recorder.try_borrow().map(|r| r.now).unwrap_or_default();
    if tokio::runtime::Handle::try_current().is_ok() {
        turmoil::sim_elapsed().unwrap_or(harness)
    } else {
        harness
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_incarnation_is_the_latest_seen_to_start() {
        let ms = Duration::from_millis;
        let history = History {
            incarnations: vec![(1, 1, ms(0)), (0, 1, ms(0)), (1, 2, ms(300))],
            ..History::default()
        };
        assert!(history.is_current(1, 1, ms(299)));
        assert!(!history.is_current(1, 1, ms(300)), "r1.2 started");
        assert!(history.is_current(1, 2, ms(301)));
        assert!(!history.is_current(1, 2, ms(299)), "not started yet");
        assert!(history.is_current(0, 1, ms(500)));
    }
}
