//! The steps the checker chooses among: time, operations in flight, faults and the operator.

/// One step the checker may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Time passes to the next instant anything is due.
    Advance,
    /// The operation in flight at this index reaches the server (if not yet) and its answer is
    /// delivered.
    Deliver(u8),
    /// The server runs the operation at this index; its answer comes late (a fault).
    Delay(u8),
    /// The operation at this index, or its answer, is lost (a fault).
    Lose(u8),
    /// A replica's process crashes and restarts; `fin`: its sockets closed visibly.
    Crash {
        /// The replica.
        replica: u8,
        /// Whether the server saw the sockets close.
        fin: bool,
    },
    /// `pg_terminate_backend` of a replica's lock session.
    Terminate(u8),
    /// A replica stops taking input.
    Pause(u8),
    /// A paused replica goes on.
    Resume(u8),
    /// A replica is cut off from the server (both directions).
    Partition(u8),
    /// A partition heals.
    Heal(u8),
    /// The ordered stop of a replica.
    Stop(u8),
    /// The operator's resign.
    Resign(u8),
    /// The operator's eligibility switch.
    Eligible(u8, bool),
    /// The server restarts; its clients see their connections reset.
    Restart,
    /// The primary fails over to a new one; nobody hears of it.
    Failover,
}

impl Step {
    /// Whether the step ends a fault (a resume, a heal, eligibility back): it is free, and the
    /// quiet period after the faults starts with it.
    pub fn ends_fault(self) -> bool {
        matches!(
            self,
            Self::Resume(_) | Self::Heal(_) | Self::Eligible(_, true)
        )
    }

    /// The step as a trace shows it: `name` gives a replica's name, `flight` describes the
    /// operation at an index (with a leading space).
    pub fn describe(self, name: impl Fn(u8) -> u8, flight: impl Fn(u8) -> String) -> String {
        match self {
            Self::Advance => "advance".to_owned(),
            Self::Deliver(i) => format!("deliver{}", flight(i)),
            Self::Delay(i) => format!("delay the answer of{}", flight(i)),
            Self::Lose(i) => format!("lose{}", flight(i)),
            Self::Crash { replica, fin } => {
                let how = if fin { "sockets closed" } else { "silently" };
                format!("crash and restart r{} ({how})", name(replica))
            }
            Self::Terminate(r) => format!("pg_terminate_backend of r{}'s session", name(r)),
            Self::Pause(r) => format!("pause r{}", name(r)),
            Self::Resume(r) => format!("resume r{}", name(r)),
            Self::Partition(r) => format!("partition r{} from the server", name(r)),
            Self::Heal(r) => format!("heal r{}'s partition", name(r)),
            Self::Stop(r) => format!("ordered stop of r{}", name(r)),
            Self::Resign(r) => format!("resign r{}", name(r)),
            Self::Eligible(r, e) => format!("r{} eligible: {e}", name(r)),
            Self::Restart => "server restart".to_owned(),
            Self::Failover => "failover".to_owned(),
        }
    }
}
