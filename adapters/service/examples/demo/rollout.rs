//! `--rollout`: the parent restarts its replicas one at a time with a newer version and prints
//! each leadership move it reads from their lines.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// The version the replicas start with.
pub(crate) const FROM: &str = "1.0.0";
/// The version the rollout deploys.
pub(crate) const TO: &str = "1.1.0";

/// Where the rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Until some replica leads.
    Booting,
    /// Until the instant: the last replica started is up and the election settled.
    Settling(Instant),
    /// Until replica `index` of pid `pid` exited.
    Stopping { index: u16, pid: u32 },
    /// Every replica runs the new version.
    Done,
}

/// The rollout's progress: the next replica to replace, how long to let each step settle.
#[derive(Debug)]
pub(crate) struct Rollout {
    pub(crate) phase: Phase,
    pub(crate) next: u16,
    pub(crate) replicas: u16,
    /// The preemption window (two intervals) plus two intervals: a new replica's candidacy has
    /// been live for the window and the leader has surveyed it.
    pub(crate) settle: Duration,
    pub(crate) moves: Moves,
}

impl Rollout {
    pub(crate) fn new(replicas: u16, interval: Duration) -> Self {
        Self {
            phase: Phase::Booting,
            next: 0,
            replicas,
            settle: 4 * interval,
            moves: Moves::default(),
        }
    }

    /// When the current settling ends (`None`: not settling).
    pub(crate) fn settled_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Settling(at) => Some(at),
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
