//! How the `status` command writes times and durations.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `at` in UTC as `YYYY-MM-DDTHH:MM:SSZ` (whole seconds, truncated); times before 1970 read as
/// 1970-01-01T00:00:00Z.
pub fn format_utc(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at.max(UNIX_EPOCH)).to_string()
}

/// `duration` as `1d 2h 3m 4s`, leaving out leading zero units (`0s` for less than a second).
pub fn format_duration(duration: Duration) -> String {
    let total = duration.as_secs();
    let parts = [
        (total / 86_400, "d"),
        (total % 86_400 / 3600, "h"),
        (total % 3600 / 60, "m"),
        (total % 60, "s"),
    ];
    let first = parts
        .iter()
        .position(|(n, _)| *n > 0)
        .unwrap_or(parts.len() - 1);
    parts[first..]
        .iter()
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_are_formatted_as_rfc3339() {
        assert_eq!(format_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let at = UNIX_EPOCH + Duration::from_secs(1_795_966_879);
        assert_eq!(format_utc(at), "2026-11-29T15:41:19Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(format_utc(leap), "2000-02-29T00:00:00Z");
        assert_eq!(
            format_utc(UNIX_EPOCH + Duration::from_millis(1_999)),
            "1970-01-01T00:00:01Z"
        );
    }

    #[test]
    fn durations_leave_out_leading_zero_units() {
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(Duration::from_millis(61_900)), "1m 1s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h 0m 0s");
        assert_eq!(
            format_duration(Duration::from_secs(2 * 86_400 + 5)),
            "2d 0h 0m 5s"
        );
    }
}
