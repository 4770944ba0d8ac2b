//! `--rollout`: the parent replaces its replicas one at a time with a newer version, in the
//! surge order a Kubernetes rolling update uses (`maxSurge: 1`, `maxUnavailable: 0`): it starts
//! a new replica beside the old ones, waits until the new version leads (or for a bound), then
//! stops one old replica, and so on. Leadership then moves exactly once per deploy, old → new:
//! stopping the old leader first would move it twice (old → old → new). It prints each
//! leadership move it reads from the replicas' lines.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// The version the replicas start with.
pub(crate) const FROM: &str = "1.0.0";
/// The version the rollout deploys.
pub(crate) const TO: &str = "1.1.0";

/// How many settling spans a surge waits at most for the new version to lead before it stops
/// the old replica anyway (the move then shows in the counts).
const SURGE_SPANS: u32 = 25;

/// Where the rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Until some replica leads.
    Booting,
    /// Until the instant: the election settles after the boot or an old replica's exit; then
    /// the next new replica starts.
    Settling(Instant),
    /// The new replica of this step runs beside the old ones. At `at` the old replica is
    /// stopped if the new version leads or `give_up` passed; else the check repeats a
    /// settling span later.
    Surging { at: Instant, give_up: Instant },
    /// Until the old replica of pid `pid` exited.
    Stopping { pid: u32 },
    /// Every replica runs the new version.
    Done,
}

/// What the parent does next ([`Rollout::step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Start a replica of version [`TO`] in slot `index` (its HTTP port is the base plus it).
    StartNew { index: u16 },
    /// Stop (SIGTERM) the old replica of pid `pid`.
    StopOld { pid: u32 },
    /// Every old replica was replaced: print [`Rollout::done`].
    Done,
    /// Nothing yet.
    Wait,
}

/// The rollout's progress: the old replicas left to replace, how long to let each step settle.
#[derive(Debug)]
pub(crate) struct Rollout {
    pub(crate) phase: Phase,
    /// The old replicas' pids, in start order; `next` is the one to replace next.
    old: Vec<u32>,
    next: usize,
    /// The preemption window (two intervals) plus two intervals: a new replica's candidacy has
    /// been live for the window and the leader has surveyed it.
    pub(crate) settle: Duration,
    pub(crate) moves: Moves,
}

impl Rollout {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            phase: Phase::Booting,
            old: Vec::new(),
            next: 0,
            settle: 4 * interval,
            moves: Moves::default(),
        }
    }

    /// Replica `index` runs as `pid` with `version`; one of [`FROM`] is replaced in its turn.
    pub(crate) fn started(&mut self, index: u16, pid: u32, version: &str) {
        self.moves.started(index, pid, version);
        if version == FROM {
            self.old.push(pid);
        }
    }

    /// When the phase's timer fires (`None`: no timer).
    pub(crate) fn settled_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Settling(at) | Phase::Surging { at, .. } => Some(at),
            _ => None,
        }
    }

    /// The lines a replica's line implies; moves from booting to settling at the first leader.
    pub(crate) fn line(&mut self, line: &str) -> Vec<String> {
        let said = self.moves.line(line);
        if self.phase == Phase::Booting && self.moves.leader.is_some() {
            self.phase = Phase::Settling(Instant::now() + self.settle);
        }
        said
    }

    /// `pid` exited: the step whose old replica it was is over, and the election settles.
    pub(crate) fn exited(&mut self, pid: u32, now: Instant) {
        if self.phase == (Phase::Stopping { pid }) {
            self.next += 1;
            self.phase = Phase::Settling(now + self.settle);
        }
    }

    /// What to do when the phase's timer fired at `now`; `free` is the lowest slot no running
    /// replica uses (where a new replica starts, so that a surge needs one port more).
    pub(crate) fn step(&mut self, now: Instant, free: u16) -> Step {
        match self.phase {
            Phase::Settling(_) if self.next < self.old.len() => {
                self.phase = Phase::Surging {
                    at: now + self.settle,
                    give_up: now + SURGE_SPANS * self.settle,
                };
                Step::StartNew { index: free }
            }
            Phase::Settling(_) => {
                self.phase = Phase::Done;
                Step::Done
            }
            Phase::Surging { give_up, .. } if self.new_version_leads() || now >= give_up => {
                let pid = self.old[self.next];
                self.phase = Phase::Stopping { pid };
                Step::StopOld { pid }
            }
            Phase::Surging { give_up, .. } => {
                self.phase = Phase::Surging {
                    at: now + self.settle,
                    give_up,
                };
                Step::Wait
            }
            Phase::Booting | Phase::Stopping { .. } | Phase::Done => Step::Wait,
        }
    }

    fn new_version_leads(&self) -> bool {
        self.moves
            .leader
            .and_then(|pid| self.moves.versions.get(&pid))
            .is_some_and(|version| version == TO)
    }

    /// The summary line.
    pub(crate) fn done(&self) -> String {
        let moves = &self.moves;
        let leader = moves
            .leader
            .map_or_else(|| "nobody".to_owned(), |pid| moves.who(pid));
        let version = moves
            .leader
            .and_then(|pid| moves.versions.get(&pid))
            .map_or("none", String::as_str);
        format!(
            "event=rollout-done from={FROM} to={TO} moves={} to_new={} back_to_old={} \
             leader={leader} version={version}",
            moves.moves, moves.to_new, moves.back
        )
    }
}

/// Who leads, from the replicas' `event=acquired` lines, and how leadership moved.
#[derive(Debug, Default)]
pub(crate) struct Moves {
    versions: HashMap<u32, String>,
    indexes: HashMap<u32, u16>,
    /// The pid of the replica that acquired last.
    leader: Option<u32>,
    /// A move whose previous leader's end line has not come yet: `(from, to)` pids.
    pending: Option<(u32, u32)>,
    /// The end cause of each replica's last term, until it acquires again.
    ended: HashMap<u32, String>,
    pub(crate) moves: usize,
    pub(crate) to_new: usize,
    pub(crate) back: usize,
}

impl Moves {
    /// Replica `index` runs as `pid` with `version`.
    pub(crate) fn started(&mut self, index: u16, pid: u32, version: &str) {
        self.versions.insert(pid, version.to_owned());
        self.indexes.insert(pid, index);
    }

    /// `pid` exited: a move still waiting for its end line is printed with cause `exited`.
    pub(crate) fn exited(&mut self, pid: u32) -> Vec<String> {
        match self.pending {
            Some((from, to)) if from == pid => {
                self.pending = None;
                vec![self.moved(from, to, "exited")]
            }
            _ => Vec::new(),
        }
    }

    fn who(&self, pid: u32) -> String {
        let index = self
            .indexes
            .get(&pid)
            .map_or_else(|| "?".to_owned(), u16::to_string);
        let version = self.versions.get(&pid).map_or("?", String::as_str);
        format!("replica-{index}/pid-{pid}@{version}")
    }

    fn moved(&mut self, from: u32, to: u32, cause: &str) -> String {
        self.moves += 1;
        let (old, new) = (self.versions.get(&from), self.versions.get(&to));
        match (old.map(String::as_str), new.map(String::as_str)) {
            (Some(FROM), Some(TO)) => self.to_new += 1,
            (Some(TO), Some(FROM)) => self.back += 1,
            _ => {}
        }
        format!(
            "event=leadership-moved from={} to={} version={} cause={cause} moves={}",
            self.who(from),
            self.who(to),
            new.map_or("?", String::as_str),
            self.moves
        )
    }

    /// What a replica's line (`[demo] replica=I pid=P event=E …`) implies.
    fn line(&mut self, line: &str) -> Vec<String> {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
        };
        let (Some(pid), Some(event)) = (field("pid").and_then(|p| p.parse().ok()), field("event"))
        else {
            return Vec::new();
        };
        if event == "acquired" {
            let previous = self.leader.replace(pid);
            self.ended.remove(&pid);
            return match previous {
                Some(from) if from != pid => match self.ended.remove(&from) {
                    Some(cause) => vec![self.moved(from, pid, &cause)],
                    None => {
                        self.pending = Some((from, pid));
                        Vec::new()
                    }
                },
                _ => Vec::new(),
            };
        }
        let cause = match event {
            "yielded" | "released" | "resigned" | "release-failed" => event.to_owned(),
            "lost" => format!("lost:{}", field("reason").unwrap_or("?")),
            "ended" => "ended".to_owned(),
            _ => return Vec::new(),
        };
        match self.pending {
            Some((from, to)) if from == pid => {
                self.pending = None;
                vec![self.moved(from, to, &cause)]
            }
            _ => {
                self.ended.insert(pid, cause);
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three old replicas (pids 10, 11, 12 in slots 0, 1, 2), 10 led by the first.
    fn booted() -> (Rollout, Instant) {
        let mut rollout = Rollout::new(Duration::from_millis(100));
        for (index, pid) in [(0, 10), (1, 11), (2, 12)] {
            rollout.started(index, pid, FROM);
        }
        rollout.line("[demo] replica=0 pid=10 event=acquired term=1 version=1.0.0");
        (rollout, Instant::now())
    }

    #[test]
    fn a_rollout_starts_each_new_replica_before_it_stops_an_old_one() {
        let (mut rollout, now) = booted();
        let mut steps = Vec::new();
        // Step 1: a new replica in the spare slot; the old leader still leads, so no stop yet.
        steps.push(rollout.step(now, 3));
        rollout.started(3, 20, TO);
        steps.push(rollout.step(now, 4));
        rollout.line("[demo] replica=3 pid=20 event=acquired term=2 version=1.1.0");
        steps.push(rollout.step(now, 4));
        rollout.exited(10, now);
        // Steps 2 and 3: the new version leads already, so each old replica stops once its
        // successor runs and the step settled.
        for (slot, new, old) in [(0, 21, 11), (1, 22, 12)] {
            steps.push(rollout.step(now, slot));
            rollout.started(slot, new, TO);
            steps.push(rollout.step(now, slot + 1));
            rollout.exited(old, now);
        }
        steps.push(rollout.step(now, 2));
        assert_eq!(
            steps,
            [
                Step::StartNew { index: 3 },
                Step::Wait,
                Step::StopOld { pid: 10 },
                Step::StartNew { index: 0 },
                Step::StopOld { pid: 11 },
                Step::StartNew { index: 1 },
                Step::StopOld { pid: 12 },
                Step::Done,
            ]
        );
        assert_eq!(rollout.phase, Phase::Done);
    }

    #[test]
    fn a_surge_stops_the_old_replica_anyway_once_the_new_version_failed_to_lead_in_its_bound() {
        let (mut rollout, now) = booted();
        assert_eq!(rollout.step(now, 3), Step::StartNew { index: 3 });
        rollout.started(3, 20, TO);
        let bound = SURGE_SPANS * rollout.settle;
        assert_eq!(
            rollout.step(now + bound - Duration::from_millis(1), 4),
            Step::Wait
        );
        assert_eq!(rollout.step(now + bound, 4), Step::StopOld { pid: 10 });
    }

    #[test]
    fn a_move_is_printed_once_with_the_previous_leaders_end_cause_whichever_line_comes_first() {
        let mut moves = Moves::default();
        moves.started(0, 10, FROM);
        moves.started(1, 11, FROM);
        moves.started(0, 20, TO);
        assert!(
            moves
                .line("[demo] replica=0 pid=10 event=acquired term=1 version=1.0.0")
                .is_empty()
        );
        // The end line first.
        assert!(
            moves
                .line("[demo] replica=0 pid=10 event=released term=1 cause=\"x\"")
                .is_empty()
        );
        let said = moves.line("[demo] replica=1 pid=11 event=acquired term=2 version=1.0.0");
        assert_eq!(
            said,
            [
                "event=leadership-moved from=replica-0/pid-10@1.0.0 to=replica-1/pid-11@1.0.0 \
              version=1.0.0 cause=released moves=1"
            ]
        );
        // The acquisition first.
        assert!(
            moves
                .line("[demo] replica=0 pid=20 event=acquired term=3 version=1.1.0")
                .is_empty()
        );
        let said = moves.line("[demo] replica=1 pid=11 event=yielded term=2 cause=\"y\"");
        assert_eq!(said.len(), 1);
        assert!(
            said[0].ends_with("version=1.1.0 cause=yielded moves=2"),
            "{said:?}"
        );
        assert_eq!((moves.moves, moves.to_new, moves.back), (2, 1, 0));
    }
}
