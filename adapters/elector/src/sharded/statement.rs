//! What a shard space's statements answer the driver: the completion of each operation (its
//! event, and for a survey the view it shows and how long it took), and how a failed statement
//! or an unreadable reply becomes an event.

use std::time::Duration;

use plexsphere_leader_core::ConnId;
use plexsphere_leader_core::shards::ShardEvent;

use super::view::SpaceView;
use crate::error::CheckError;
use crate::operation;
use crate::shard_sql::ShardSqlError;

/// An answered survey: the view it shows and how long it took.
pub(super) type Surveyed = Option<(SpaceView, Duration)>;
/// The completion of one operation of a shard space.
pub(super) type Completion = operation::Completion<ShardEvent<CheckError>, Surveyed>;
/// One operation of a shard space in flight.
pub(super) type Operation = operation::Operation<ShardEvent<CheckError>, Surveyed>;

/// A statement on `conn` failed with `cause`; `session_ended` when the failure ended its
/// session (an advisory lock session; a lease's statements end none).
pub(super) fn failed(
    conn: ConnId,
    cause: CheckError,
    session_ended: bool,
) -> ShardEvent<CheckError> {
    ShardEvent::StatementFailed {
        conn,
        cause,
        session_ended,
    }
}

/// The rows of `statement` do not read as its contract says.
pub(super) fn unexpected(statement: &'static str, error: &ShardSqlError) -> CheckError {
    CheckError::UnexpectedReply {
        statement,
        detail: error.to_string(),
    }
}
