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
/// ([`session::prove_exclusion`](crate::session::prove_exclusion)).
pub(crate) async fn prove(
    sessions: &dyn SessionSource,
    second_within: Duration,
) -> Result<PoolProof<CheckError>, CheckError> {
    let mut first = ClosedUnlessAnswered(Some(sessions.acquire().await?));
    let first_pid = backend(held(&first)?).await?;
    let opened = tokio::time::timeout(second_within, async {
        let second = ClosedUnlessAnswered(Some(sessions.open_outside_pool().await?));
        let pid = backend(held(&second)?).await?;
        Ok::<_, CheckError>((second, pid))
    })
    .await;
    let (mut second, second_pid) = match opened {
        Ok(Ok(second)) => second,
        Ok(Err(cause)) => {
            first.answered();
            return Ok(unanswered(first_pid, SecondSession::Failed(cause)));
        }
        Err(_) => {
            first.answered();
            return Ok(unanswered(first_pid, SecondSession::TimedOut));
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
