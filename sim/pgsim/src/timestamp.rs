//! `timestamptz` text as PostgreSQL prints it with `DateStyle` ISO and `TimeZone` UTC.
//!
//! Written here rather than borrowed from the CLI crate's `format_utc`: the server depends on
//! nothing above the elector.

/// A `timestamptz` of `micros` since the Unix epoch as PostgreSQL prints it with `DateStyle`
/// ISO and `TimeZone` UTC: `2026-01-01 00:00:00.25+00` (the fraction only when not zero,
/// without trailing zeros). A negative value prints as the epoch.
pub(crate) fn timestamp_text(micros: i64) -> String {
    let micros = u64::try_from(micros).unwrap_or(0);
    let seconds = micros / 1_000_000;
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    let whole = format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02}");
    let fraction = micros % 1_000_000;
    if fraction == 0 {
        format!("{whole}+00")
    } else {
        let digits = format!("{fraction:06}");
        format!("{whole}.{}+00", digits.trim_end_matches('0'))
    }
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

#[cfg(test)]
mod tests {
    use super::timestamp_text;

    const SECOND: i64 = 1_000_000;

    #[test]
    fn the_epoch_and_a_negative_time_print_as_midnight_of_1970() {
        assert_eq!(timestamp_text(0), "1970-01-01 00:00:00+00");
        assert_eq!(timestamp_text(-5), "1970-01-01 00:00:00+00");
    }

    #[test]
    fn whole_seconds_print_without_a_fraction() {
        assert_eq!(
            timestamp_text(1_795_966_879 * SECOND),
            "2026-11-29 15:41:19+00"
        );
        assert_eq!(
            timestamp_text(951_782_400 * SECOND),
            "2000-02-29 00:00:00+00"
        );
    }

    #[test]
    fn a_fraction_prints_without_trailing_zeros() {
        assert_eq!(timestamp_text(1_999_000), "1970-01-01 00:00:01.999+00");
        assert_eq!(timestamp_text(250_000), "1970-01-01 00:00:00.25+00");
        assert_eq!(timestamp_text(1), "1970-01-01 00:00:00.000001+00");
    }
}
