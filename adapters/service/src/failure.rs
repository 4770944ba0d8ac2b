//! How a failed pass or worker is reported: its error's whole chain of causes with the
//! server's SQLSTATE, and the marker that says retrying cannot fix it.

use std::error::Error;
use std::fmt;

use crate::task::BoxError;

/// An error that retrying will not fix (a missing privilege, a configuration error): a
/// worker that returns it is not restarted by the [`Supervisor`](crate::Supervisor) (it stays
/// stopped and fails the `workers` probe), and a leader-ticked pass that keeps returning it (or
/// failing with one of [`UNFIT_SQLSTATES`], [`is_permanent`]) for its patience makes the leader
/// resign ([`LeaderSource::step_down`](crate::loops::LeaderSource::step_down)), so that a
/// replica able to do the work takes over when there is one; see
/// [`UNFIT_PATIENCE_PERIODS`](crate::loops::UNFIT_PATIENCE_PERIODS).
#[derive(Debug)]
pub struct Permanent(BoxError);

impl Permanent {
    /// Marks `error` as permanent.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }

    /// `error` marked as permanent, boxed, as a pass or a worker returns it.
    pub fn boxed(error: impl Into<BoxError>) -> BoxError {
        Box::new(Self::new(error))
    }

    /// Whether `error` is marked as permanent.
    pub fn is(error: &(dyn Error + 'static)) -> bool {
        error.downcast_ref::<Self>().is_some()
    }
}

impl fmt::Display for Permanent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Error for Permanent {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

/// The SQLSTATEs of a pass's failure that say this replica cannot do the leader's work at all,
/// whatever it retries: `42501` (insufficient privilege: a role without the grants the work
/// needs) and `25006` (read-only transaction: a read-only role, `default_transaction_read_only`,
/// or a hot standby reached by mistake).
pub const UNFIT_SQLSTATES: [&str; 2] = ["42501", "25006"];

/// Whether `error` says the work cannot succeed on this replica by retrying: marked
/// [`Permanent`], or failed with one of [`UNFIT_SQLSTATES`].
pub fn is_permanent(error: &(dyn Error + 'static)) -> bool {
    Permanent::is(error)
        || report(error)
            .sqlstate
            .is_some_and(|code| UNFIT_SQLSTATES.contains(&code.as_str()))
}

/// An error that says the database could not be reached or dropped the session (a refused or
/// lost connection, a server shutting down or starting up, a failover): a worker that returns
/// it is restarted by the [`Supervisor`](crate::Supervisor) without spending its restart budget
/// (see [`is_unavailable`]), so no outage, pooler restart or failover stops a loop for good.
/// Wrap in it what [`is_unavailable`] cannot recognise by type (a pool's wait timeout, another
/// driver's connection error).
#[derive(Debug)]
pub struct Unavailable(BoxError);

impl Unavailable {
    /// Marks `error` as caused by a lost or refused connection.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }

    /// `error` marked as unavailable, boxed, as a pass or a worker returns it.
    pub fn boxed(error: impl Into<BoxError>) -> BoxError {
        Box::new(Self::new(error))
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Error for Unavailable {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

/// The SQLSTATEs that say the server refused or ended the session, not the work: class `08`
/// (connection exception), `57P01` (admin shutdown), `57P02` (crash shutdown), `57P03` (cannot
/// connect now: starting up, shutting down, in recovery) and `53300` (too many connections).
pub const UNAVAILABLE_SQLSTATES: [&str; 4] = ["57P01", "57P02", "57P03", "53300"];

/// Whether `error` was caused by a lost or refused connection rather than by the work: some
/// error of its chain is marked [`Unavailable`], carries an SQLSTATE of class `08` or one of
/// [`UNAVAILABLE_SQLSTATES`], is a closed tokio-postgres connection (feature `tokio-postgres`),
/// or is an I/O error of a refused, reset, aborted or timed-out connection. Recognised by type,
/// never by text: a string that only says "connection refused" is an ordinary failure.
pub fn is_unavailable(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(cause) = next {
        if unavailable_itself(cause) {
            return true;
        }
        next = cause.source();
    }
    false
}

fn unavailable_itself(error: &(dyn Error + 'static)) -> bool {
    if error.downcast_ref::<Unavailable>().is_some() {
        return true;
    }
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        use std::io::ErrorKind::{
            BrokenPipe, ConnectionAborted, ConnectionRefused, ConnectionReset, NotConnected,
            TimedOut, UnexpectedEof,
        };
        return matches!(
            io.kind(),
            ConnectionRefused
                | ConnectionReset
                | ConnectionAborted
                | NotConnected
                | BrokenPipe
                | TimedOut
                | UnexpectedEof
        );
    }
    #[cfg(feature = "tokio-postgres")]
    if let Some(postgres) = error.downcast_ref::<tokio_postgres::Error>()
        && postgres.is_closed()
    {
        return true;
    }
    sqlstate_of(error).is_some_and(|code| {
        code.starts_with("08") || UNAVAILABLE_SQLSTATES.contains(&code.as_str())
    })
}

/// A failure as a log line or a probe says it: the error's text followed by each source's
/// (`": "`-separated, a source left out when the text before already says it: the driver's
/// `db error` alone says nothing of the server's message), and the server's SQLSTATE when an
/// error of the chain carries one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// The chain of causes.
    pub text: String,
    /// The server's SQLSTATE (`42501`, …), when known.
    pub sqlstate: Option<String>,
}

/// Reports `error` ([`Reported`]).
pub fn report(error: &(dyn Error + 'static)) -> Reported {
    let mut text = error.to_string();
    let mut sqlstate = sqlstate_of(error);
    let mut source = error.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        sqlstate = sqlstate.or_else(|| sqlstate_of(cause));
        source = cause.source();
    }
    Reported { text, sqlstate }
}

/// The SQLSTATE `error` itself carries: the elector's own error, or (feature `tokio-postgres`)
/// tokio-postgres'.
fn sqlstate_of(error: &(dyn Error + 'static)) -> Option<String> {
    if let Some(check) = error.downcast_ref::<plexsphere_leader::session::CheckError>() {
        return check.sqlstate().map(str::to_owned);
    }
    #[cfg(feature = "tokio-postgres")]
    if let Some(postgres) = error.downcast_ref::<tokio_postgres::Error>() {
        return postgres.code().map(|code| code.code().to_owned());
    }
    #[cfg(feature = "tokio-postgres")]
    if let Some(db) = error.downcast_ref::<tokio_postgres::error::DbError>() {
        return Some(db.code().code().to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("db error")
        }
    }

    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_report_keeps_every_cause_once_and_the_sqlstate() {
        let error = Outer(std::io::Error::other(
            "permission denied for table invitations",
        ));
        let reported = report(&error);
        assert_eq!(
            reported.text,
            "db error: permission denied for table invitations"
        );
        assert_eq!(reported.sqlstate, None);
        let check = plexsphere_leader::session::CheckError::backend(
            std::io::Error::other("ERROR: permission denied"),
            Some("42501".into()),
        );
        let reported = report(&check);
        assert_eq!(reported.sqlstate.as_deref(), Some("42501"));
        // Marked permanent, the text and the chain are the same.
        let permanent = Permanent::new(Outer(std::io::Error::other("no")));
        assert!(Permanent::is(&permanent));
        assert_eq!(report(&permanent).text, "db error: no");
        let boxed: BoxError = Permanent::boxed(std::io::Error::other("x"));
        assert!(Permanent::is(boxed.as_ref()));
        assert!(!Permanent::is(&std::io::Error::other("x")));
    }

    #[test]
    fn a_lost_or_refused_connection_is_recognised_by_type_anywhere_in_the_chain() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(is_unavailable(&refused));
        assert!(is_unavailable(&Outer(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
        // Text says nothing: only types and SQLSTATEs do.
        let text: BoxError = "error connecting to server: Connection refused".into();
        assert!(!is_unavailable(text.as_ref()));
        assert!(!is_unavailable(&std::io::Error::other(
            "connection refused"
        )));
        let state = |code: &str| {
            plexsphere_leader::session::CheckError::backend(
                std::io::Error::other("FATAL"),
                Some(code.into()),
            )
        };
        for code in ["57P01", "57P03", "08006", "08001", "53300"] {
            assert!(is_unavailable(&state(code)), "{code}");
        }
        for code in ["42501", "25006", "40001", "23505"] {
            assert!(!is_unavailable(&state(code)), "{code}");
        }
        let marked = Unavailable::boxed(std::io::Error::other("pool wait timed out"));
        assert!(is_unavailable(marked.as_ref()));
        assert_eq!(report(marked.as_ref()).text, "pool wait timed out");
    }
}
