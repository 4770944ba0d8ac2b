//! The identity a leader writes into its lock session's `application_name`.
//!
//! On the grant, in the grant statement itself, the lock session's `application_name` becomes
//!
//! ```text
//! <identity> since <unix seconds>
//! ```
//!
//! where `<unix seconds>` is the server's `clock_timestamp()` when the lock was taken (whole
//! seconds since 1970-01-01 UTC, the server's clock: no replica's clock is trusted). The
//! identity is at most [`MAX_IDENTITY_LEN`] bytes of printable ASCII, so the whole name fits
//! `application_name`'s 63 bytes until the year 2286. A refused check leaves the pooled
//! session's name alone; the lock session is taken out of the pool, so the name stays until
//! the session closes.

/// The longest identity, in bytes: `application_name` keeps 63 bytes, and ` since ` with ten
/// digits of unix seconds takes 17.
pub const MAX_IDENTITY_LEN: usize = 63 - SINCE.len() - 10;

/// What separates the identity from the grant time in the `application_name`.
pub(crate) const SINCE: &str = " since ";

/// Why an identity was refused ([`Config::identity`](crate::Config::identity)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The identity is empty.
    #[error("the identity is empty")]
    Empty,
    /// The identity has a byte outside printable ASCII (space to `~`), which PostgreSQL would
    /// replace in `application_name`.
    #[error(
        "the identity {identity:?} has a character that is not printable ASCII at byte {at}: \
         application_name keeps only space to '~'"
    )]
    NotPrintableAscii {
        /// The identity.
        identity: String,
        /// The byte offset of the first offending character.
        at: usize,
    },
    /// The identity is longer than [`MAX_IDENTITY_LEN`] bytes.
    #[error(
        "the identity {identity:?} is {len} bytes long; at most {max} fit \
         application_name's 63 bytes beside the grant time",
        max = MAX_IDENTITY_LEN
    )]
    TooLong {
        /// The identity.
        identity: String,
        /// Its length in bytes.
        len: usize,
    },
}

/// Checks a configured identity.
pub(crate) fn validate(identity: &str) -> Result<(), IdentityError> {
    if identity.is_empty() {
        return Err(IdentityError::Empty);
    }
    if let Some(at) = identity.bytes().position(|b| !is_printable(b)) {
        return Err(IdentityError::NotPrintableAscii {
            identity: identity.to_owned(),
            at,
        });
    }
    if identity.len() > MAX_IDENTITY_LEN {
        return Err(IdentityError::TooLong {
            identity: identity.to_owned(),
            len: identity.len(),
        });
    }
    Ok(())
}

/// The configured identity, validated, or [`default_identity`] when none is configured.
///
/// # Errors
/// The configured identity is invalid ([`validate`]).
pub(crate) fn resolve(configured: Option<&str>) -> Result<String, IdentityError> {
    match configured {
        Some(identity) => {
            validate(identity)?;
            Ok(identity.to_owned())
        }
        None => Ok(default_identity()),
    }
}

/// The default identity, `<service>@<host>`: the current executable's file stem and the
/// hostname, with characters outside printable ASCII replaced by `?` and cut to
/// [`MAX_IDENTITY_LEN`] bytes. Never fails: a part that cannot be read is `unknown`.
pub(crate) fn default_identity() -> String {
    let service = std::env::current_exe()
        .ok()
        .and_then(|path| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let host = if host.is_empty() {
        "unknown"
    } else {
        host.as_str()
    };
    sanitize(&format!("{service}@{host}"))
}

/// `text` with every character outside printable ASCII replaced by `?`, cut to
/// [`MAX_IDENTITY_LEN`] bytes; `unknown` when empty.
pub(crate) fn sanitize(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| {
            if c.is_ascii() && is_printable(c as u8) {
                c
            } else {
                '?'
            }
        })
        .take(MAX_IDENTITY_LEN)
        .collect();
    if clean.is_empty() {
        "unknown".to_owned()
    } else {
        clean
    }
}

fn is_printable(byte: u8) -> bool {
    (0x20..=0x7e).contains(&byte)
}

/// Splits an `application_name` written by a grant into the identity and the grant time in
/// unix seconds; `None` when it does not end in ` since <digits>`. The last ` since ` counts,
/// so an identity may itself contain the word.
pub(crate) fn parse_application_name(name: &str) -> Option<(&str, u64)> {
    let (identity, seconds) = name.rsplit_once(SINCE)?;
    if identity.is_empty() || seconds.is_empty() || !seconds.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((identity, seconds.parse().ok()?))
}

/// A lease holder for a run of `identity`: `<identity> <nonce>`, the nonce a 64-bit hash of
/// a per-call random key, the process id and the wall clock: distinct for every run, so that a
/// restarted replica never mistakes its former run's lease, or member row, for its own.
pub(crate) fn lease_holder(identity: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    hasher.write_u128(since_epoch.map_or(0, |d| d.as_nanos()));
    format!("{identity} {:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_is_printable_ascii_of_at_most_46_bytes() {
        assert_eq!(MAX_IDENTITY_LEN, 46);
        assert_eq!(validate("scheduler@web-1"), Ok(()));
        assert_eq!(validate("it's \"quoted\" \\ too"), Ok(()));
        assert_eq!(validate(""), Err(IdentityError::Empty));
        assert!(matches!(
            validate("tab\there"),
            Err(IdentityError::NotPrintableAscii { at: 3, .. })
        ));
        assert!(matches!(
            validate("café"),
            Err(IdentityError::NotPrintableAscii { at: 3, .. })
        ));
        assert_eq!(validate(&"x".repeat(46)), Ok(()));
        assert!(matches!(
            validate(&"x".repeat(47)),
            Err(IdentityError::TooLong { len: 47, .. })
        ));
    }

    #[test]
    fn the_default_identity_is_service_at_host_and_always_valid() {
        let identity = default_identity();
        assert_eq!(validate(&identity), Ok(()));
        let (service, _host) = identity.split_once('@').expect("service@host");
        assert!(!service.is_empty());
        assert_eq!(sanitize("é\u{7f}x"), "??x");
        assert_eq!(sanitize(""), "unknown");
        assert_eq!(sanitize(&"y".repeat(80)).len(), MAX_IDENTITY_LEN);
    }

    #[test]
    fn application_names_of_grants_parse_from_the_last_since() {
        assert_eq!(
            parse_application_name("scheduler@web-1 since 1795966628"),
            Some(("scheduler@web-1", 1_795_966_628))
        );
        assert_eq!(
            parse_application_name("ever since since 5"),
            Some(("ever since", 5))
        );
        for name in [
            "",
            "psql",
            "x since ",
            "x since 12a",
            " since 5",
            "x since -5",
        ] {
            assert_eq!(parse_application_name(name), None, "{name:?}");
        }
    }
}
