//! The exclusion proof ([`Action::ProbePool`](plexsphere_leader_core::Action::ProbePool),
//! [`plexsphere_leader_core::proof`]): a pooled connection and a session of its own, held at
//! once, each asked for its server backend; then, on two backends, the proof's key taken on the
//! first and tried on the second. What each answered is reported; the core judges it.

use std::sync::Arc;
use std::time::Duration;

use plexsphere_leader_core::proof::{ExclusionTest, PROOF_CLASS_ID, PoolProof, SecondSession};

use super::{ClosedUnlessAnswered, boolean, one_row, parse_int, text};
use crate::error::CheckError;
use crate::key::LockKey;
use crate::session::{LockSession, QueryError, SessionSource};
use crate::sql;

/// Runs the proof for either election: `proved` makes the event of what it observed, `failed`
/// the event of a failure. The second session, with its backend's answer, is given up after
/// `second_within` and reported as [`SecondSession::TimedOut`]; its failure is reported as
/// [`SecondSession::Failed`], and the first connection then goes back to the pool (it
/// answered). `failed` reports the first borrow's failure or a failed statement of the lock
/// test (what it borrowed is then closed: the state of the proof's key on it is unknown).
/// Dropped (a stop, the core's deadline), it closes what it holds.
pub(crate) fn probe<E: Send + 'static, X: Default + Send + 'static>(
    sessions: Arc<dyn SessionSource>,
    second_within: Duration,
    proved: impl FnOnce(PoolProof<CheckError>) -> E + Send + 'static,
    failed: impl FnOnce(CheckError) -> E + Send + 'static,
) -> crate::operation::Operation<E, X> {
    Box::pin(async move {
        crate::operation::Completion::of(match prove(&*sessions, second_within).await {
            Ok(proof) => proved(proof),
            Err(cause) => failed(cause),
        })
    })
}

/// The exclusion proof on `sessions`, as a run performs it before its first attempt
/// ([`status::prove_exclusion`](crate::status::prove_exclusion)).
pub(crate) async fn prove(
    sessions: &dyn SessionSource,
    second_within: Duration,
) -> Result<PoolProof<CheckError>, CheckError> {
    let mut first = ClosedUnlessAnswered(Some(sessions.acquire().await?));
    let first_pid = backend(held(&first)?).await?;
    // Boxed, so that dropping it ends its setup before a kept one is cancelled.
    let mut second = Box::pin(async {
        let second = ClosedUnlessAnswered(Some(sessions.open_outside_pool().await?));
        let pid = backend(held(&second)?).await?;
        Ok::<_, CheckError>((second, pid))
    });
    let opened = match tokio::time::timeout(second_within, &mut second).await {
        Ok(opened) => Opened::Second(opened),
        // Not yet: the first asks again while the second still waits. A pooler that queues
        // the second for the first's own server session (session mode, its one server session
        // taken) answers the first at once; one that shares server sessions between clients
        // serves the earlier-queued second first, or neither.
        Err(_) => tokio::select! {
            biased;
            opened = &mut second => Opened::Second(opened),
            again = backend(held(&first)?) => Opened::FirstAgain(again?),
            () = tokio::time::sleep(second_within / 2) => {
                // The first's second answer is unknown too: it is closed, not pooled.
                return Ok(unanswered(first_pid, SecondSession::TimedOut));
            }
        },
    };
    let (mut second, second_pid) = match opened {
        Opened::Second(Ok(second)) => second,
        Opened::Second(Err(cause)) => {
            first.answered();
            return Ok(unanswered(first_pid, SecondSession::Failed(cause)));
        }
        Opened::FirstAgain(again) => {
            // The second's setup, queued for the first's server session, is not kept for a
            // later proof: it would be first in line when this client leaves that session (a
            // killed leader's pooler would hand the session to a client that is gone, and
            // close it, lock and all).
            drop(second);
            sessions.cancel_kept();
            first.answered();
            return Ok(unanswered(
                first_pid,
                SecondSession::QueuedBehindFirst { again },
            ));
        }
    };
    let proof = |exclusion| PoolProof {
        first: first_pid,
        second: SecondSession::Answered(second_pid),
        exclusion,
    };
    if second_pid == first_pid {
        // One server session for both: nothing is taken on a session another client shares.
        first.answered();
        second.answered();
        return Ok(proof(None));
    }
    let key = LockKey::new(PROOF_CLASS_ID, first_pid);
    let (first_backend, first_granted) = try_key(held(&first)?, key).await?;
    let (second_backend, second_granted) = if first_granted {
        try_key(held(&second)?, key).await?
    } else {
        (second_pid, false)
    };
    if !second_granted {
        second.answered();
    }
    // A second grant is closed with its session (dropped unanswered) and never pooled.
    drop(second);
    let released = !first_granted || release(held(&first)?, key).await?;
    if released {
        first.answered();
    }
    Ok(proof(Some(ExclusionTest {
        first_backend,
        first_granted,
        second_backend,
        second_granted,
    })))
}

/// How the wait for the second session ended.
enum Opened {
    /// The second session answered with its backend, or failed.
    Second(Result<(ClosedUnlessAnswered, i32), CheckError>),
    /// The first answered again, from this backend, while the second still waited.
    FirstAgain(i32),
}

/// The proof with no lock test: the second session did not answer.
fn unanswered(first: i32, second: SecondSession<CheckError>) -> PoolProof<CheckError> {
    PoolProof {
        first,
        second,
        exclusion: None,
    }
}

fn held(borrowed: &ClosedUnlessAnswered) -> Result<&dyn LockSession, CheckError> {
    borrowed.0.as_deref().ok_or(CheckError::SessionEnded)
}

async fn backend(session: &dyn LockSession) -> Result<i32, CheckError> {
    let name = "the exclusion proof";
    let row = one_row(session, sql::BACKEND_PID, name)
        .await
        .map_err(QueryError::into_cause)?;
    parse_int(&text(&row, 0, name)?, name)
}

/// Tries the proof's `key` ([`sql::prove_exclusion`]): the backend that answered, and whether
/// it was granted.
async fn try_key(session: &dyn LockSession, key: LockKey) -> Result<(i32, bool), CheckError> {
    let name = "the exclusion proof's lock test";
    let row = one_row(session, &sql::prove_exclusion(key), name)
        .await
        .map_err(QueryError::into_cause)?;
    let backend = parse_int(&text(&row, 0, name)?, name)?;
    match text(&row, 1, name)?.as_str() {
        "t" => Ok((backend, true)),
        "f" => Ok((backend, false)),
        other => Err(super::unexpected(name, format!("{other:?}"))),
    }
}

/// Releases the proof's `key` on the first session: whether it held it.
async fn release(session: &dyn LockSession, key: LockKey) -> Result<bool, CheckError> {
    boolean(
        session,
        &sql::release_proof(key),
        "the exclusion proof's release",
    )
    .await
}
