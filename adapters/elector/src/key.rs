//! The advisory lock key of an election.

use std::fmt;
use std::str::FromStr;

/// The key of one election: the two `int4`s of PostgreSQL's two-key advisory lock functions
/// (`pg_try_advisory_lock(class_id, obj_id)`). Electors with the same key on the same database
/// elect one leader among them; electors with different keys are independent elections (one
/// per shard, per service, …) that never wait for each other.
///
/// In `pg_locks` the held lock shows as `locktype = 'advisory'`, `classid = class_id`,
/// `objid = obj_id` (both as unsigned `oid`s: a negative `int4` shows as its two's complement)
/// and `objsubid = 2`, which no `bigint` key ever collides with.
///
/// Its text form, for command lines and logs, is `<class_id>:<obj_id>` (`1886156915:1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    /// The first `int4` (`pg_locks.classid`).
    pub class_id: i32,
    /// The second `int4` (`pg_locks.objid`).
    pub obj_id: i32,
}

impl LockKey {
    /// The key of the spec, `(1886156915, 1)`: `0x706C7873` is ASCII `plxs`. Every elector
    /// uses it unless [`Config::key`](crate::Config::key) says otherwise.
    pub const DEFAULT: Self = Self::new(1_886_156_915, 1);

    /// The key `(class_id, obj_id)`.
    pub const fn new(class_id: i32, obj_id: i32) -> Self {
        Self { class_id, obj_id }
    }
}

impl Default for LockKey {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for LockKey {
    /// `<class_id>:<obj_id>`, as [`FromStr`] reads it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.class_id, self.obj_id)
    }
}

/// A text that is not a [`LockKey`] of the form `<class_id>:<obj_id>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid lock key {text:?}: expected CLASSID:OBJID, two int4 numbers such as 1886156915:1")]
pub struct ParseLockKeyError {
    text: String,
}

impl FromStr for LockKey {
    type Err = ParseLockKeyError;

    /// Reads `<class_id>:<obj_id>`: two decimal `int4`s (optionally negative), no spaces.
    ///
    /// # Errors
    /// [`ParseLockKeyError`] when the text has no `:`, or either side is not an `i32`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || ParseLockKeyError {
            text: text.to_owned(),
        };
        let (class_id, obj_id) = text.split_once(':').ok_or_else(invalid)?;
        let int = |part: &str| {
            // `i32::from_str` accepts a leading `+`; the key's text form never has one.
            if part.starts_with('+') {
                return Err(invalid());
            }
            part.parse::<i32>().map_err(|_| invalid())
        };
        Ok(Self::new(int(class_id)?, int(obj_id)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_key_round_trips_through_its_text_form() {
        assert_eq!(LockKey::DEFAULT.to_string(), "1886156915:1");
        assert_eq!("1886156915:1".parse(), Ok(LockKey::DEFAULT));
        assert_eq!("-7:2147483647".parse(), Ok(LockKey::new(-7, i32::MAX)));
        assert_eq!(LockKey::new(-7, i32::MIN).to_string(), "-7:-2147483648");
        assert_eq!(LockKey::default(), LockKey::DEFAULT);
    }

    #[test]
    fn malformed_keys_are_rejected() {
        for text in [
            "",
            "1",
            "1:",
            ":1",
            "1:2:3",
            "1 :2",
            "a:1",
            "+1:2",
            "2147483648:1",
            "1:0x10",
        ] {
            assert!(text.parse::<LockKey>().is_err(), "{text:?}");
        }
    }
}
