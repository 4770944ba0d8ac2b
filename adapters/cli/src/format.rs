//! How the `status` command writes times and durations.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `at` in UTC as `YYYY-MM-DDTHH:MM:SSZ` (whole seconds, truncated); times before 1970 read as
/// 1970-01-01T00:00:00Z.
pub fn format_utc(at: SystemTime) -> String {
    let seconds = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
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
