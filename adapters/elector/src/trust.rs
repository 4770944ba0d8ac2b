//! The open term's trust deadline ([`Election::trust_deadline`]), kept where every reader can
//! compare it with the election's clock at the moment of its call: `is_leader()`, `term()`, the
//! launchers built on them, and the Prometheus gauges at scrape time, whether or not the
//! driver has run since the deadline passed (a process resumed after a pause, a stalled
//! runtime).
//!
//! [`Election::trust_deadline`]: plexsphere_leader_core::Election::trust_deadline

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::clock::Clock;

/// No deadline: the advisory lock's terms, and no term.
const NO_DEADLINE: u64 = u64::MAX;

/// One elector's trust deadline, as nanoseconds after `base` on its clock.
#[derive(Debug)]
pub(crate) struct Trust {
    deadline: AtomicU64,
    base: Instant,
    clock: Arc<dyn Clock>,
}

impl Trust {
    /// No deadline yet, on `clock`.
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            deadline: AtomicU64::new(NO_DEADLINE),
            base: clock.now(),
            clock,
        }
    }

    /// Records the core's trust deadline of the open term; `None` for none.
    pub(crate) fn set(&self, deadline: Option<Instant>) {
        let nanos = deadline.map_or(NO_DEADLINE, |at| {
            let after = at.saturating_duration_since(self.base);
            u64::try_from(after.as_nanos()).map_or(NO_DEADLINE - 1, |n| n.min(NO_DEADLINE - 1))
        });
        self.deadline.store(nanos, Ordering::Release);
    }

    /// Whether the deadline, if any, lies ahead on the election's clock now.
    pub(crate) fn holds_now(&self) -> bool {
        match self.deadline.load(Ordering::Acquire) {
            NO_DEADLINE => true,
            nanos => {
                let elapsed = self.clock.now().saturating_duration_since(self.base);
                u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX) < nanos
            }
        }
    }
}
