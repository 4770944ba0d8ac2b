//! `plexsphere-leader lease`: who holds a lease election's lease, and until when.

use plexsphere_leader::LockKey;
use plexsphere_leader::status::LeaseStatus;

use crate::format_utc;

/// The `text` answer: one headline, then the details.
pub fn render_text(key: LockKey, database: &str, lease: Option<&LeaseStatus>) -> String {
    let Some(lease) = lease else {
        return format!("lease election {key} on database {database:?}: never claimed");
    };
    let state = if lease.held {
        "held by"
    } else {
        "released or expired; last held by"
    };
    let epoch = lease.epoch.map_or_else(
        || "none (no fence row)".to_owned(),
        |epoch| epoch.to_string(),
    );
    format!(
        "lease election {key} on database {database:?}: {state} {identity:?}\n  \
         until:  {until} (server clock)\n  \
         epoch:  {epoch}\n  \
         holder: {holder}",
        identity = lease.identity,
        until = format_utc(lease.expires_at),
        holder = lease.holder,
    )
}

/// The `json` answer: one object, `lease` null when it was never claimed.
pub fn render_json(key: LockKey, database: &str, lease: Option<&LeaseStatus>) -> String {
    let lease = lease.map(|lease| {
        serde_json::json!({
            "holder": lease.holder,
            "identity": lease.identity,
            "epoch": lease.epoch,
            "expires_at": format_utc(lease.expires_at),
            "held": lease.held,
        })
    });
    serde_json::json!({
        "key": key.to_string(),
        "database": database,
        "lease": lease,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn a_lease_renders_its_holder_and_expiry_and_none_says_so() {
        let lease = LeaseStatus {
            key: LockKey::DEFAULT,
            holder: "billing@web-3 00ff".into(),
            identity: "billing@web-3".into(),
            epoch: Some(4),
            expires_at: UNIX_EPOCH + Duration::from_secs(1_764_669_000),
            held: true,
        };
        let text = render_text(LockKey::DEFAULT, "app", Some(&lease));
        assert!(text.starts_with(
            "lease election 1886156915:1 on database \"app\": held by \"billing@web-3\""
        ));
        assert!(text.contains("epoch:  4"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&render_json(LockKey::DEFAULT, "app", Some(&lease))).unwrap();
        assert_eq!(json["lease"]["held"], true);
        assert_eq!(json["lease"]["epoch"], 4);
        assert!(render_text(LockKey::DEFAULT, "app", None).ends_with("never claimed"));
        let json: serde_json::Value =
            serde_json::from_str(&render_json(LockKey::DEFAULT, "app", None)).unwrap();
        assert!(json["lease"].is_null());
    }
}
