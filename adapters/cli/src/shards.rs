//! The answer of `plexsphere-leader shards`: who owns which shards of a space.

use plexsphere_leader::status::OwnerRow;

/// A shard space as the server's views show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Space {
    class: i32,
    count: u32,
    database: String,
    holders: Vec<OwnerRow>,
    unowned: Vec<u32>,
}

impl Space {
    /// The space `class` of `count` shards in `database`, from the rows of
    /// [`status::shard_owners`](plexsphere_leader::status::shard_owners).
    pub fn new(class: i32, count: u32, database: &str, holders: Vec<OwnerRow>) -> Self {
        let mut owned = vec![false; count as usize];
        for holder in &holders {
            for shard in &holder.shards {
                if let Some(slot) = owned.get_mut(shard.get() as usize) {
                    *slot = true;
                }
            }
        }
        let unowned = (0..count).filter(|s| !owned[*s as usize]).collect();
        Self {
            class,
            count,
            database: database.to_owned(),
            holders,
            unowned,
        }
    }

    /// The shards nobody holds.
    pub fn unowned(&self) -> &[u32] {
        &self.unowned
    }

    /// Lines for people: a headline, one line per holder, the unowned shards.
    pub fn render_text(&self) -> String {
        let members = self.holders.iter().filter(|h| h.member).count();
        let mut text = format!(
            "shard space {} ({} shards) on database {:?}: {} members, {} unowned",
            self.class,
            self.count,
            self.database,
            members,
            self.unowned.len()
        );
        let width = self
            .holders
            .iter()
            .map(|h| h.name.as_deref().unwrap_or("?").len())
            .max()
            .unwrap_or(1);
        for holder in &self.holders {
            let numbers: Vec<u32> = holder.shards.iter().map(|s| s.get()).collect();
            text.push_str(&format!(
                "\n  {:<width$}  pid {:<7} {:>5} shards  {}{}{}",
                holder.name.as_deref().unwrap_or("?"),
                holder.pid.get(),
                numbers.len(),
                ranges(&numbers),
                holder.rank.map_or_else(String::new, |rank| format!(
                    "  (priority {}, version {})",
                    rank.priority, rank.version
                )),
                if holder.member {
                    ""
                } else {
                    "  (not a member)"
                },
            ));
        }
        text.push_str(&format!(
            "\n  unowned: {}",
            if self.unowned.is_empty() {
                "none".to_owned()
            } else {
                ranges(&self.unowned)
            }
        ));
        text
    }

    /// One JSON object on one line.
    pub fn render_json(&self) -> String {
        let holders: Vec<serde_json::Value> = self
            .holders
            .iter()
            .map(|h| {
                serde_json::json!({
                    "pid": h.pid.get(),
                    "name": h.name,
                    "priority": h.rank.map(|rank| rank.priority),
                    "version": h.rank.map(|rank| rank.version.to_string()),
                    "member": h.member,
                    "count": h.shards.len(),
                    "shards": h.shards.iter().map(|s| s.get()).collect::<Vec<_>>(),
                })
            })
            .collect();
        serde_json::json!({
            "class": self.class,
            "shards": self.count,
            "database": self.database,
            "members": self.holders.iter().filter(|h| h.member).count(),
            "holders": holders,
            "unowned": self.unowned,
        })
        .to_string()
    }
}

/// `0-3,7,9-12`: ascending numbers as ranges.
pub fn ranges(numbers: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut iter = numbers.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexsphere_leader::sharded::{MemberId, Shard};

    fn holder(pid: i32, name: &str, member: bool, shards: &[u32]) -> OwnerRow {
        OwnerRow {
            pid: MemberId::new(pid),
            name: Some(name.to_owned()),
            member,
            shards: shards.iter().copied().map(Shard::new).collect(),
            rank: None,
        }
    }

    #[test]
    fn ranges_fold_runs() {
        assert_eq!(ranges(&[0, 1, 2, 3, 7, 9, 10, 11, 12]), "0-3,7,9-12");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(ranges(&[]), "-");
    }

    #[test]
    fn the_text_names_every_holder_and_the_unowned_shards() {
        let space = Space::new(
            7,
            8,
            "app",
            vec![
                holder(10, "a", true, &[0, 1, 2]),
                holder(11, "b", true, &[4, 5]),
                holder(12, "x", false, &[7]),
            ],
        );
        assert_eq!(space.unowned(), &[3, 6]);
        let text = space.render_text();
        assert!(
            text.starts_with("shard space 7 (8 shards) on database \"app\": 2 members, 2 unowned")
        );
        assert!(text.contains("a  pid 10          3 shards  0-2"), "{text}");
        assert!(text.contains("(not a member)"));
        assert!(text.ends_with("unowned: 3,6"));
        let json: serde_json::Value = serde_json::from_str(&space.render_json()).unwrap();
        assert_eq!(json["unowned"], serde_json::json!([3, 6]));
        assert_eq!(json["holders"][0]["count"], 3);
    }
}
