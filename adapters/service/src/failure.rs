//! How a failed pass or worker is reported: its error's whole chain of causes with the
//! server's SQLSTATE, and the marker that says retrying cannot fix it.

use std::error::Error;
use std::fmt;

use crate::task::BoxError;

/// An error that retrying will not fix (a missing privilege, a configuration error): a
/// worker that returns it is not restarted by the [`Supervisor`](crate::Supervisor) (it stays
/// stopped and fails the `workers` probe), and a leader-ticked pass that returns it (or fails
/// with one of [`UNFIT_SQLSTATES`], [`is_permanent`]) makes the leader resign ([`LeaderSource::step_down`](crate::loops::LeaderSource::step_down)), so that
/// a replica able to do the work takes over instead of this one holding leadership while its
/// work fails.
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
}
