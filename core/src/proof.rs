//! The exclusion proof: before a run's first attempt, the advisory lock proves that its sessions
//! are its own and that the server's lock excludes, instead of assuming either.
//!
//! A server that speaks PostgreSQL's protocol may still grant a session advisory lock to every
//! session (stubs that answer `true`, or a lock that two sessions can both take), and a
//! transaction- or statement-mode pooler runs one client's statements on server sessions other
//! clients share. On either, every replica would lead. The proof
//! ([`Action::ProbePool`](crate::Action::ProbePool)) holds a pooled session and a second,
//! distinct one at once and observes:
//!
//! 1. each one's server backend (`pg_backend_pid()`): one backend for both is a multiplexing
//!    pooler, found before the lock is touched;
//! 2. when the backends differ, the lock itself: the first session takes the proof's key
//!    ([`PROOF_CLASS_ID`], the first backend's pid), then the second tries the same key while
//!    the first holds it, each answer with the backend that gave it. A lock that excludes
//!    refuses the second; a grant to both is a server whose lock does not exclude; an answer
//!    from another backend than the session's own is a pooler that moved the session.
//!
//! The adapter reports what it observed ([`PoolProof`]); [`PoolProof::verdict`] is the
//! election's judgement. Nothing that is not a proof counts as one: a second session that did
//! not come or failed, or a key another session held, is [`Verdict::Inconclusive`], and the run
//! tries the proof again at its next check, never the lock.

use crate::cause::LockFinding;
pub use crate::cause::Unproven;

/// The first `int4` of the proof's key, `0x706C7870` (ASCII `plxp`), beside the election's
/// default `plxs`. The second is the first session's backend pid, unique among live sessions,
/// so that proofs of several replicas at once never take each other's key.
pub const PROOF_CLASS_ID: i32 = 0x706C_7870;

/// What the pool proof observed, as the adapter reports it in
/// [`Event::PoolProbed`](crate::Event::PoolProbed).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolProof<C> {
    /// The first session's backend: a connection borrowed from the pool.
    pub first: i32,
    /// The second session, opened while the first was held.
    pub second: SecondSession<C>,
    /// The lock test; `None` when it was not run (no second backend, or the same one).
    pub exclusion: Option<ExclusionTest>,
}

/// The proof's second session: a client connection of its own, outside the pool where the
/// source can open one (so that a pool of one connection is proven too).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SecondSession<C> {
    /// It answered from this server backend.
    Answered(i32),
    /// It, or its answer, did not come within the action's `second_within`, nor within half
    /// as long again, while the first, asked again, did not answer either.
    TimedOut,
    /// It did not come within `second_within`, and the first, asked again while it still
    /// waited, answered first from backend `again`: the pooler queues the second client for
    /// the first's own server session (a session-mode pooler whose one server session the
    /// first holds), which it shares with no one. A pooler that shares server sessions
    /// between clients serves the earlier-queued second first.
    QueuedBehindFirst {
        /// The backend that answered the first's second question.
        again: i32,
    },
    /// Opening it, or its statement, failed with this error.
    Failed(C),
}

/// The lock test: the first session took the proof's key, then the second tried it while the
/// first held it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExclusionTest {
    /// The backend that answered the first session's try.
    pub first_backend: i32,
    /// Whether the first session was granted the key.
    pub first_granted: bool,
    /// The backend that answered the second session's try.
    pub second_backend: i32,
    /// Whether the second session was granted the key too (`false` whenever the first was not
    /// granted: the second does not try then).
    pub second_granted: bool,
}

/// The election's judgement of a [`PoolProof`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict<C> {
    /// Two server sessions of their own, and the lock refused the second while the first held
    /// it: the run may try the lock.
    Proven,
    /// Nothing is proven, for this reason: no attempt this check; the next check proves again.
    Inconclusive(Unproven<C>),
    /// The lock cannot elect one leader here, for good: the run fails before any term.
    Refuted(LockFinding),
}

impl<C> PoolProof<C> {
    /// What the proof observes on a server whose lock excludes, through two sessions of their
    /// own on backends `first` and `second`: for models and test doubles of the server.
    pub const fn excluding(first: i32, second: i32) -> Self {
        Self {
            first,
            second: SecondSession::Answered(second),
            exclusion: Some(ExclusionTest {
                first_backend: first,
                first_granted: true,
                second_backend: second,
                second_granted: false,
            }),
        }
    }

    /// Judges the proof: refuted when one backend answered both sessions, when a session's
    /// statement was answered by another backend than its own, or when both sessions were
    /// granted the key; proven only when the second was refused the key the first held.
    pub fn verdict(self) -> Verdict<C> {
        let second = match self.second {
            SecondSession::Answered(second) => second,
            SecondSession::TimedOut => return Verdict::Inconclusive(Unproven::NoSecondSession),
            // The first's server session is its own (no second one can be had, so the lock's
            // exclusion cannot be tested: the one server session is this client's alone).
            SecondSession::QueuedBehindFirst { again } if again == self.first => {
                return Verdict::Proven;
            }
            SecondSession::QueuedBehindFirst { again } => {
                return Verdict::Refuted(LockFinding::BackendChanged {
                    granted: self.first,
                    now: again,
                });
            }
            SecondSession::Failed(cause) => {
                return Verdict::Inconclusive(Unproven::SecondFailed(cause));
            }
        };
        if second == self.first {
            return Verdict::Refuted(LockFinding::PoolSharesBackend {
                backend_pid: self.first,
            });
        }
        let Some(test) = self.exclusion else {
            return Verdict::Inconclusive(Unproven::NotTested);
        };
        for (granted, now) in [
            (self.first, test.first_backend),
            (second, test.second_backend),
        ] {
            if granted != now {
                return Verdict::Refuted(LockFinding::BackendChanged { granted, now });
            }
        }
        match (test.first_granted, test.second_granted) {
            (true, false) => Verdict::Proven,
            (true, true) => Verdict::Refuted(LockFinding::LockNotExclusive {
                first: self.first,
                second,
            }),
            (false, _) => Verdict::Inconclusive(Unproven::KeyTaken),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proof(
        second: SecondSession<&'static str>,
        test: Option<ExclusionTest>,
    ) -> PoolProof<&'static str> {
        PoolProof {
            first: 10,
            second,
            exclusion: test,
        }
    }

    fn test(first_granted: bool, second_granted: bool) -> ExclusionTest {
        ExclusionTest {
            first_backend: 10,
            first_granted,
            second_backend: 11,
            second_granted,
        }
    }

    #[test]
    fn two_backends_and_a_refused_second_try_prove_the_lock() {
        let proof = proof(SecondSession::Answered(11), Some(test(true, false)));
        assert_eq!(proof.verdict(), Verdict::Proven);
    }

    #[test]
    fn a_second_grant_of_the_held_key_refutes_the_lock() {
        let proof = proof(SecondSession::Answered(11), Some(test(true, true)));
        assert_eq!(
            proof.verdict(),
            Verdict::Refuted(LockFinding::LockNotExclusive {
                first: 10,
                second: 11
            })
        );
    }

    #[test]
    fn one_backend_for_both_sessions_is_a_multiplexing_pool() {
        let proof = proof(SecondSession::Answered(10), None);
        assert_eq!(
            proof.verdict(),
            Verdict::Refuted(LockFinding::PoolSharesBackend { backend_pid: 10 })
        );
    }

    #[test]
    fn a_test_answered_by_another_backend_is_a_pooler_that_moved_the_session() {
        let moved_first = ExclusionTest {
            first_backend: 12,
            ..test(true, false)
        };
        assert_eq!(
            proof(SecondSession::Answered(11), Some(moved_first)).verdict(),
            Verdict::Refuted(LockFinding::BackendChanged {
                granted: 10,
                now: 12
            })
        );
        let moved_second = ExclusionTest {
            second_backend: 10,
            ..test(true, false)
        };
        assert_eq!(
            proof(SecondSession::Answered(11), Some(moved_second)).verdict(),
            Verdict::Refuted(LockFinding::BackendChanged {
                granted: 11,
                now: 10
            })
        );
    }

    #[test]
    fn a_second_session_queued_behind_the_first_proves_the_first_owns_its_session() {
        let queued = |again| proof(SecondSession::QueuedBehindFirst { again }, None);
        assert_eq!(queued(10).verdict(), Verdict::Proven);
        assert_eq!(
            queued(12).verdict(),
            Verdict::Refuted(LockFinding::BackendChanged {
                granted: 10,
                now: 12
            })
        );
    }

    #[test]
    fn a_late_or_failed_second_session_proves_nothing() {
        assert_eq!(
            proof(SecondSession::TimedOut, None).verdict(),
            Verdict::Inconclusive(Unproven::NoSecondSession)
        );
        assert_eq!(
            proof(SecondSession::Failed("too many connections"), None).verdict(),
            Verdict::Inconclusive(Unproven::SecondFailed("too many connections"))
        );
    }

    #[test]
    fn each_reason_for_proving_nothing_says_what_was_missing() {
        let text = |why: Unproven<&str>| crate::Cause::Unproven(why).to_string();
        assert_eq!(
            text(Unproven::NoSecondSession),
            "the exclusion proof proved nothing: no second session answered within half an \
             interval (a saturated pool or pooler, or a slow link)"
        );
        assert_eq!(
            text(Unproven::SecondFailed("too many connections")),
            "the exclusion proof proved nothing: the second session failed: too many connections"
        );
        assert_eq!(
            text(Unproven::KeyTaken),
            "the exclusion proof proved nothing: another session held the proof's key"
        );
        assert_eq!(
            text(Unproven::NotTested),
            "the exclusion proof proved nothing: the lock test did not run"
        );
    }

    #[test]
    fn a_first_session_refused_the_key_or_no_test_proves_nothing() {
        assert_eq!(
            proof(SecondSession::Answered(11), Some(test(false, false))).verdict(),
            Verdict::Inconclusive(Unproven::KeyTaken)
        );
        assert_eq!(
            proof(SecondSession::Answered(11), None).verdict(),
            Verdict::Inconclusive(Unproven::NotTested)
        );
    }
}
