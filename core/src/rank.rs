//! A replica's rank ([`Options::preference`](crate::Options::preference)): the ordered
//! preference by which a leader yields to a better candidate and worse standbys defer to it,
//! so that a rolling deploy moves leadership once, to the newest version.
//!
//! A [`Rank`] is a priority, then a [`Version`]: a higher priority always wins, and among equal
//! priorities the newer version. A [`Candidate`] is another replica's published rank with how
//! long it has been a candidate, as a survey of the server found it.

use std::cmp::Ordering;
use std::fmt;
use std::time::Duration;

/// The most numeric parts a [`Version`] keeps (`major.minor.patch.build`).
pub const VERSION_PARTS: usize = 4;

/// The longest pre-release tag a [`Version`] keeps, in bytes.
pub const MAX_PRE_RELEASE_LEN: usize = 20;

/// A release number that compares as releases do: numerically part by part (`1.10.0` is newer
/// than `1.9.3`, a missing part is 0, so `2.1` equals `2.1.0`), and a pre-release
/// (`2.0.0-rc.1`) older than its release, pre-releases ordered by their dot-separated
/// identifiers as semantic versioning orders them (numbers numerically and below words).
/// A leading `v` and build metadata after `+` are ignored.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version {
    parts: [u32; VERSION_PARTS],
    pre_len: u8,
    pre: [u8; MAX_PRE_RELEASE_LEN],
}

/// Why a text is not a [`Version`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionError {
    /// The text given.
    pub given: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl fmt::Display for VersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not a release number like 1.4.2 or 2.0.0-rc.1: {}",
            self.given, self.why
        )
    }
}

impl std::error::Error for VersionError {}

impl Version {
    /// The version `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self {
            parts: [major, minor, patch, 0],
            pre_len: 0,
            pre: [0; MAX_PRE_RELEASE_LEN],
        }
    }

    /// Parses `1`, `1.4`, `1.4.2`, `v1.4.2.7`, `2.0.0-rc.1` or `2.0.0-beta+build5`.
    ///
    /// # Errors
    /// [`VersionError`] for an empty number, more than [`VERSION_PARTS`] parts, a part that is
    /// not a decimal `u32`, or a pre-release tag that is empty, longer than
    /// [`MAX_PRE_RELEASE_LEN`] or not of ASCII letters, digits, `-` and `.`.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let error = |why| VersionError {
            given: text.to_owned(),
            why,
        };
        let bare = text.strip_prefix('v').unwrap_or(text);
        let bare = bare
            .split_once('+')
            .map_or(bare, |(version, _build)| version);
        let (numbers, pre) = match bare.split_once('-') {
            Some((numbers, pre)) => (numbers, Some(pre)),
            None => (bare, None),
        };
        let mut parts = [0; VERSION_PARTS];
        for (count, part) in numbers.split('.').enumerate() {
            let Some(slot) = parts.get_mut(count) else {
                return Err(error("more than four numeric parts"));
            };
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(error("each part must be a decimal number"));
            }
            *slot = part.parse().map_err(|_| error("a part is too large"))?;
        }
        let mut version = Self {
            parts,
            pre_len: 0,
            pre: [0; MAX_PRE_RELEASE_LEN],
        };
        if let Some(pre) = pre {
            let valid = pre
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
            if pre.is_empty() || pre.split('.').any(str::is_empty) || !valid {
                return Err(error(
                    "the pre-release tag must be dot-separated ASCII letters and digits",
                ));
            }
            if pre.len() > MAX_PRE_RELEASE_LEN {
                return Err(error("the pre-release tag is longer than 20 bytes"));
            }
            version.pre[..pre.len()].copy_from_slice(pre.as_bytes());
            version.pre_len = u8::try_from(pre.len()).unwrap_or(u8::MAX);
        }
        Ok(version)
    }

    /// The numeric parts, missing ones 0.
    pub fn parts(&self) -> [u32; VERSION_PARTS] {
        self.parts
    }

    /// A text whose byte order is this order (`COLLATE "C"` in SQL), for a server to keep the
    /// newest version: each part as 10 digits, then `~` for a release or each pre-release
    /// identifier (a number as `0` and 20 digits, a word as `1` and the word) separated by
    /// spaces, which sort below every character an identifier has.
    pub fn sort_key(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|part| format!("{part:010}"))
            .collect();
        let tail = match self.pre_release() {
            None => "~".to_owned(),
            Some(pre) => pre
                .split('.')
                .map(|id| {
                    if id.bytes().all(|b| b.is_ascii_digit()) {
                        let digits = id.trim_start_matches('0');
                        // Equal numbers spelt differently still order, as `Ord` orders them.
                        format!("0{digits:0>20}{id}")
                    } else {
                        format!("1{id}")
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
        };
        format!("{}|{tail}", parts.join("."))
    }

    /// The pre-release tag (`rc.1` of `2.0.0-rc.1`), if any.
    pub fn pre_release(&self) -> Option<&str> {
        let tag = &self.pre[..usize::from(self.pre_len)];
        (!tag.is_empty()).then(|| std::str::from_utf8(tag).unwrap_or(""))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.parts
            .cmp(&other.parts)
            .then_with(|| match (self.pre_release(), other.pre_release()) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
                (Some(mine), Some(theirs)) => compare_pre_releases(mine, theirs),
            })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Semantic versioning's order of pre-release tags: identifier by identifier, numbers
/// numerically and below words, words by their bytes, a longer tag above its prefix.
fn compare_pre_releases(mine: &str, theirs: &str) -> Ordering {
    let numeric = |id: &str| id.bytes().all(|b| b.is_ascii_digit());
    let mut theirs_ids = theirs.split('.');
    for id in mine.split('.') {
        let Some(other) = theirs_ids.next() else {
            return Ordering::Greater;
        };
        let order = match (numeric(id), numeric(other)) {
            (true, true) => {
                // Digits only: compare by length (no leading zeros matter), then by text.
                let (a, b) = (id.trim_start_matches('0'), other.trim_start_matches('0'));
                // Equal numbers spelt differently (`01`, `1`) still order, as `Eq` tells them apart.
                a.len()
                    .cmp(&b.len())
                    .then_with(|| a.cmp(b))
                    .then_with(|| id.cmp(other))
            }
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            (false, false) => id.cmp(other),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    if theirs_ids.next().is_some() {
        Ordering::Less
    } else {
        Ordering::Equal
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [major, minor, patch, build] = self.parts;
        write!(f, "{major}.{minor}.{patch}")?;
        if build != 0 {
            write!(f, ".{build}")?;
        }
        if let Some(pre) = self.pre_release() {
            write!(f, "-{pre}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version({self})")
    }
}

impl std::str::FromStr for Version {
    type Err = VersionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// A replica's place in the order of preference: its `priority` first (higher wins), then its
/// `version` (newer wins). Replicas of equal rank are interchangeable: none yields to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rank {
    /// The operator's priority: a higher one is preferred whatever the versions.
    pub priority: u32,
    /// The replica's release number.
    pub version: Version,
}

impl Rank {
    /// The rank of `version` at priority 0.
    pub const fn of_version(version: Version) -> Self {
        Self {
            priority: 0,
            version,
        }
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "priority {} version {}", self.priority, self.version)
    }
}

/// What a survey does with the version floor ([`Options::version_floor`](crate::Options::version_floor)):
/// the newest version that has led this election, kept by the server for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FloorStep {
    /// No floor: nothing read or written.
    Off,
    /// A standby's survey reads the floor.
    Read,
    /// The leader's survey raises the floor to its version (if it is newer) and reads it.
    Raise(Version),
    /// A leader allowed below the floor ([`Options::below_floor`](crate::Options::below_floor):
    /// a deliberate rollback) sets the floor to its version and reads it.
    Set(Version),
}

/// Another replica's candidacy as a survey found it: its rank, and for how long (on the
/// server's clock) it has been a live candidate without a break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Candidate {
    /// The candidate's rank.
    pub rank: Rank,
    /// How long it has been a candidate.
    pub live_for: Duration,
}

/// The best of `candidates`: the highest rank, the longest-live among equals.
pub fn best(candidates: &[Candidate]) -> Option<Candidate> {
    candidates
        .iter()
        .copied()
        .max_by(|a, b| a.rank.cmp(&b.rank).then(a.live_for.cmp(&b.live_for)))
}

#[cfg(test)]
mod tests;
