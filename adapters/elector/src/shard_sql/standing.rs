//! A shard member's [`Standing`] (its rank, and whether it is allowed below the version floor),
//! published where the space's survey already reads each member's name: before the identity in
//! the lock session's `application_name` with advisory locks, before the holder in the member
//! row with leases. No statement changes and no column is added for it; an unranked member's
//! name is exactly its identity, as before ranks.
//!
//! ```text
//! ~<priority>:<version>[!] <identity>
//! ```
//!
//! `!` marks a member allowed below the floor. A name without the tag, or with a tag that does
//! not parse, is an unranked member of that name.

use plexsphere_leader_core::rank::{Rank, Version};
use plexsphere_leader_core::shards::Standing;

/// `name` as a member of `standing` publishes it: the tag and a space before it when ranked,
/// `name` alone when not.
pub fn published(name: &str, standing: Standing) -> String {
    match standing.rank {
        None => name.to_owned(),
        Some(rank) => {
            let allowed = if standing.below_floor_allowed {
                "!"
            } else {
                ""
            };
            format!("~{}:{}{allowed} {name}", rank.priority, rank.version)
        }
    }
}

/// The standing and the name of a published `text` ([`published`]).
pub fn parse(text: &str) -> (Standing, &str) {
    let unranked = (Standing::default(), text);
    let Some((tag, name)) = text.strip_prefix('~').and_then(|t| t.split_once(' ')) else {
        return unranked;
    };
    let (tag, below_floor_allowed) = match tag.strip_suffix('!') {
        Some(tag) => (tag, true),
        None => (tag, false),
    };
    let Some((priority, version)) = tag.split_once(':') else {
        return unranked;
    };
    let (Ok(priority), Ok(version)) = (priority.parse(), Version::parse(version)) else {
        return unranked;
    };
    let standing = Standing {
        rank: Some(Rank { priority, version }),
        below_floor_allowed,
    };
    (standing, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_standing_reads_back_and_an_unranked_name_is_unchanged() {
        let version = Version::parse("2.0.0-rc.1").expect("valid");
        for (priority, allowed) in [(0, false), (7, true)] {
            let standing = Standing {
                rank: Some(Rank { priority, version }),
                below_floor_allowed: allowed,
            };
            let text = published("svc@web-1 a1b2", standing);
            assert_eq!(parse(&text), (standing, "svc@web-1 a1b2"), "{text}");
        }
        assert_eq!(published("svc@web-1", Standing::default()), "svc@web-1");
        assert_eq!(
            published(
                "svc",
                Standing {
                    rank: Some(Rank::of_version(Version::new(1, 10, 0))),
                    below_floor_allowed: false
                }
            ),
            "~0:1.10.0 svc"
        );
    }

    #[test]
    fn a_name_without_a_valid_tag_is_an_unranked_member_of_that_name() {
        for text in [
            "svc@web-1",
            "~svc",
            "~0:x.y svc",
            "~a:1.0 svc",
            "~1.0 svc",
            "~0:1.0",
        ] {
            assert_eq!(parse(text), (Standing::default(), text), "{text}");
        }
    }
}
