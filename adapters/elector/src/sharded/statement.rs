//! What a shard space's statements answer the driver: the completion of each operation (its
//! event, and for a survey the view it shows and how long it took), and how a failed statement
//! or an unreadable reply becomes an event.

use std::collections::BTreeMap;
use std::time::Duration;

use plexsphere_leader_core::ConnId;
use plexsphere_leader_core::rank::Version;
use plexsphere_leader_core::shards::{MemberId, ShardEvent, Survey};

use super::view::SpaceView;
use crate::error::CheckError;
use crate::operation;
use crate::shard_sql::{ShardSqlError, standing};

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

/// The completion of a survey of `conn` that answered `survey` (its holders named by `names`,
/// each with the [`Standing`](plexsphere_leader_core::shards::Standing) it published before
/// its name, and the version `floor` it read) in `took`: the event, and the view it shows with
/// the time it took.
pub(super) fn surveyed(
    conn: ConnId,
    survey: Survey,
    names: &BTreeMap<MemberId, String>,
    floor: Option<Version>,
    took: Duration,
) -> Completion {
    let mut bare = BTreeMap::new();
    let mut standings = Vec::new();
    for (&member, text) in names {
        let (standing, name) = standing::parse(text);
        standings.push((member, standing));
        bare.insert(member, name.to_owned());
    }
    let survey = survey.with_standings(standings).with_floor(floor);
    Completion {
        extra: Some((SpaceView::of(&survey, &bare), took)),
        ..Completion::of(ShardEvent::Surveyed { conn, survey })
    }
}
