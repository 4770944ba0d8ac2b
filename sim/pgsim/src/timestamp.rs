//! `timestamptz` text as PostgreSQL prints it with `DateStyle` ISO and `TimeZone` UTC.

use std::time::{Duration, UNIX_EPOCH};

/// A `timestamptz` of `micros` since the Unix epoch as PostgreSQL prints it with `DateStyle`
/// ISO and `TimeZone` UTC: `2026-01-01 00:00:00.25+00` (the fraction only when not zero,
/// without trailing zeros). A negative value prints as the epoch.
pub(crate) fn timestamp_text(micros: i64) -> String {
    let micros = u64::try_from(micros).unwrap_or(0);
    let at = UNIX_EPOCH + Duration::from_micros(micros);
    // RFC 3339 with microseconds: `2026-01-01T00:00:00.250000Z`.
    let rfc3339 = humantime::format_rfc3339_micros(at).to_string();
    let (date_time, fraction) = rfc3339
        .trim_end_matches('Z')
        .split_once('.')
        .unwrap_or((&rfc3339, ""));
    let whole = date_time.replacen('T', " ", 1);
    match fraction.trim_end_matches('0') {
        "" => format!("{whole}+00"),
        digits => format!("{whole}.{digits}+00"),
    }
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
