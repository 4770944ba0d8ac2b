//! The leader's check: what the lock verification found, and the verdict over it.
//!
//! The driver runs one statement on the lock session and reports the row as a [`LockCheck`];
//! [`LockCheck::verdict`] decides, without I/O, whether the session still proves the lock.

use crate::cause::LockFinding;

/// What the leader's check statement returned on the lock session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockCheck {
    /// The backend that answered (`pg_backend_pid()`).
    pub backend_pid: i32,
    /// Whether the server is in recovery (`pg_is_in_recovery()`).
    pub in_recovery: bool,
    /// Whether the answering session holds the election's lock (the check's re-entrant
    /// `pg_try_advisory_lock` answered `true`); `false` when another session holds it.
    pub holds_lock: bool,
    /// Whether the session carries the marker this client's grant statement set (another
    /// client's grant on the same server session replaces it).
    pub marked_by_grant: bool,
}

impl LockCheck {
    /// What a healthy lock session of backend `backend_pid` answers.
    pub const fn holding(backend_pid: i32) -> Self {
        Self {
            backend_pid,
            in_recovery: false,
            holds_lock: true,
            marked_by_grant: true,
        }
    }

    /// Whether this answer proves that backend `granted` still holds the lock: the same
    /// backend, not in recovery, the lock in `pg_locks`, the session marked by this client's
    /// grant. The first failed condition, in that order, is the finding.
    ///
    /// # Errors
    /// The [`LockFinding`] that disproves the lock.
    pub const fn verdict(&self, granted: i32) -> Result<(), LockFinding> {
        if self.backend_pid != granted {
            Err(LockFinding::BackendChanged {
                granted,
                now: self.backend_pid,
            })
        } else if self.in_recovery {
            Err(LockFinding::InRecovery)
        } else if !self.holds_lock {
            Err(LockFinding::NotHeld)
        } else if !self.marked_by_grant {
            Err(LockFinding::SessionShared)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cause::LossReason;

    const PID: i32 = 4242;

    #[test]
    fn a_healthy_session_proves_the_lock() {
        assert_eq!(LockCheck::holding(PID).verdict(PID), Ok(()));
    }

    #[test]
    fn each_failed_condition_is_its_finding_and_reason() {
        let cases = [
            (
                LockCheck {
                    backend_pid: 7,
                    ..LockCheck::holding(PID)
                },
                LockFinding::BackendChanged {
                    granted: PID,
                    now: 7,
                },
                LossReason::BackendChanged,
            ),
            (
                LockCheck {
                    in_recovery: true,
                    ..LockCheck::holding(PID)
                },
                LockFinding::InRecovery,
                LossReason::ServerInRecovery,
            ),
            (
                LockCheck {
                    holds_lock: false,
                    ..LockCheck::holding(PID)
                },
                LockFinding::NotHeld,
                LossReason::LockNotHeld,
            ),
            (
                LockCheck {
                    marked_by_grant: false,
                    ..LockCheck::holding(PID)
                },
                LockFinding::SessionShared,
                LossReason::SessionShared,
            ),
        ];
        for (found, finding, reason) in cases {
            assert_eq!(found.verdict(PID), Err(finding), "{found:?}");
            assert_eq!(finding.loss_reason(), reason);
        }
    }

    #[test]
    fn the_first_failed_condition_wins_in_order() {
        let everything_wrong = LockCheck {
            backend_pid: 7,
            in_recovery: true,
            holds_lock: false,
            marked_by_grant: false,
        };
        assert!(matches!(
            everything_wrong.verdict(PID),
            Err(LockFinding::BackendChanged { .. })
        ));
        let recovering_and_unheld = LockCheck {
            in_recovery: true,
            holds_lock: false,
            marked_by_grant: false,
            ..LockCheck::holding(PID)
        };
        assert_eq!(
            recovering_and_unheld.verdict(PID),
            Err(LockFinding::InRecovery)
        );
        let unheld_and_unmarked = LockCheck {
            holds_lock: false,
            marked_by_grant: false,
            ..LockCheck::holding(PID)
        };
        assert_eq!(unheld_and_unmarked.verdict(PID), Err(LockFinding::NotHeld));
    }

    #[test]
    fn each_finding_names_its_likely_cause() {
        let texts = [
            (
                LockFinding::BackendChanged {
                    granted: PID,
                    now: 7,
                },
                "the check ran on backend 7, not on backend 4242",
            ),
            (LockFinding::InRecovery, "the server is in recovery"),
            (LockFinding::NotHeld, "another session holds the lock"),
            (LockFinding::SessionShared, "the server session is shared"),
        ];
        for (finding, text) in texts {
            assert!(finding.to_string().contains(text), "{finding}");
        }
    }
}
