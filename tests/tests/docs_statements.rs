//! Every SQL statement quoted in `docs/` is one the code runs: each ```sql block, whitespace
//! collapsed, equals a statement of `plexsphere_leader::sql` for the default key, or of
//! `plexsphere_leader::shard_sql` for the default shard class and 1,024 shards. A statement
//! changed in the code without its docs fails here (issue 16 §4: docs that drifted).

use plexsphere_leader::sharded::DEFAULT_SHARD_CLASS;
use plexsphere_leader::{LockKey, shard_sql, sql};

/// The docs pages, by name.
const PAGES: [(&str, &str); 5] = [
    ("reference.md", include_str!("../../docs/reference.md")),
    ("operations.md", include_str!("../../docs/operations.md")),
    ("design.md", include_str!("../../docs/design.md")),
    ("metrics.md", include_str!("../../docs/metrics.md")),
    ("loops.md", include_str!("../../docs/loops.md")),
];

/// Whitespace collapsed to single spaces, around parentheses and commas made uniform, and a
/// trailing `;` dropped.
fn normalized(statement: &str) -> String {
    let collapsed = statement.split_whitespace().collect::<Vec<_>>().join(" ");
    collapsed
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(" ,", ",")
        .trim_end_matches(';')
        .trim()
        .to_owned()
}

/// The statements of the code that docs may quote, for the default key.
fn code_statements() -> Vec<(&'static str, String)> {
    let key = LockKey::DEFAULT;
    vec![
        ("sql::leader_query", sql::leader_query(key)),
        ("sql::who_leads", sql::who_leads(key)),
        ("sql::verify", sql::verify(key)),
        ("sql::advance_epoch", sql::advance_epoch(key)),
        ("sql::fence_check", sql::fence_check(key)),
        ("sql::release_if_held", sql::release_if_held(key)),
        ("sql::unlock", sql::unlock(key)),
        ("sql::FENCE_SETUP", sql::FENCE_SETUP.to_owned()),
        (
            "shard_sql::owners (default class, 1024 shards)",
            shard_sql::owners(DEFAULT_SHARD_CLASS, 1024),
        ),
        (
            "shard_sql::survey (default class, 1024 shards)",
            shard_sql::survey(
                DEFAULT_SHARD_CLASS,
                1024,
                plexsphere_leader::rank::FloorStep::Off,
            ),
        ),
        ("shard_sql::unlock_all", shard_sql::unlock_all()),
    ]
}

/// The ```sql blocks of `page`.
fn sql_blocks(page: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```sql") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_statement_quoted_in_the_docs_is_the_codes() {
    let code = code_statements();
    let mut stale = Vec::new();
    let mut quoted = 0;
    for (name, page) in PAGES {
        for block in sql_blocks(page) {
            quoted += 1;
            let text = normalized(&block);
            if !code
                .iter()
                .any(|(_, statement)| normalized(statement) == text)
            {
                stale.push(format!("docs/{name}:\n{block}"));
            }
        }
    }
    assert!(
        quoted > 0,
        "the docs quote no statement: the block syntax changed?"
    );
    assert!(
        stale.is_empty(),
        "statements in docs/ that the code does not run (print the code's with \
         `sql::…(LockKey::DEFAULT)`):\n{}\n\nthe code's:\n{}",
        stale.join("\n"),
        code.iter()
            .map(|(name, statement)| format!("{name}: {statement}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
