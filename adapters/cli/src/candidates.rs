//! The candidates of a ranked election (`Config::version`) in `status` and `lease`: each live
//! candidacy's rank, identity and age ([`status::candidates`](plexsphere_leader::status::candidates)),
//! appended to the answer: a line each in text (nothing when there is none, as for an unranked
//! election), a `candidates` array in JSON.

use plexsphere_leader::status::CandidateStatus;

use crate::format_duration;

/// `text` with a line per candidate.
pub fn append_text(text: String, candidates: &[CandidateStatus]) -> String {
    let mut text = text;
    for candidate in candidates {
        text.push_str(&format!(
            "\n  candidate: {:?}, priority {}, version {}, live for {}",
            candidate.identity,
            candidate.rank.priority,
            candidate.rank.version,
            format_duration(candidate.live_for)
        ));
    }
    text
}

/// The JSON object `json` with its `candidates` array.
pub fn append_json(json: &str, candidates: &[CandidateStatus]) -> String {
    let mut value: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let listed: Vec<serde_json::Value> = candidates
        .iter()
        .map(|candidate| {
            serde_json::json!({
                "identity": candidate.identity,
                "priority": candidate.rank.priority,
                "version": candidate.rank.version.to_string(),
                "live_for_ms": u64::try_from(candidate.live_for.as_millis()).unwrap_or(u64::MAX),
            })
        })
        .collect();
    if let Some(object) = value.as_object_mut() {
        object.insert("candidates".to_owned(), serde_json::Value::Array(listed));
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use plexsphere_leader::rank::{Rank, Version};

    use super::*;

    fn candidate() -> CandidateStatus {
        CandidateStatus {
            rank: Rank {
                priority: 1,
                version: Version::parse("1.10.0").unwrap_or_else(|e| panic!("{e}")),
            },
            live_for: Duration::from_millis(2_500),
            identity: "svc@web-2".to_owned(),
        }
    }

    #[test]
    fn candidates_add_a_line_each_and_a_json_array_and_none_add_no_line() {
        assert_eq!(append_text("head".to_owned(), &[]), "head");
        let text = append_text("head".to_owned(), &[candidate()]);
        assert_eq!(
            text,
            "head\n  candidate: \"svc@web-2\", priority 1, version 1.10.0, live for 2s"
        );
        let json: serde_json::Value =
            serde_json::from_str(&append_json("{\"key\":\"1:2\"}", &[candidate()]))
                .unwrap_or_default();
        assert_eq!(json["candidates"][0]["version"], "1.10.0");
        assert_eq!(json["candidates"][0]["live_for_ms"], 2500);
        assert_eq!(json["key"], "1:2");
    }
}
