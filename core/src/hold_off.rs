//! The hold-off: a time before which a replica makes no attempt to lead (or to join a shard
//! space), set by a resign and by a lease claim that went unanswered. One rule for every mode
//! and every cause: a new hold-off never shortens one in progress.

use std::time::{Duration, Instant};

use crate::election::MAX_HOLD_OFF;

/// The hold-off after one of `hold_off` (at most [`MAX_HOLD_OFF`]) asked at `now`, given the
/// one in progress, `held`: whichever ends later.
pub(crate) fn extended(held: Option<Instant>, now: Instant, hold_off: Duration) -> Instant {
    until_later(held, now + hold_off.min(MAX_HOLD_OFF))
}

/// The hold-off in progress, `held`, or one ending at `until` when that is later.
pub(crate) fn until_later(held: Option<Instant>, until: Instant) -> Instant {
    held.map_or(until, |held| held.max(until))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_hold_off_never_shortens_the_one_in_progress_and_is_capped() {
        let now = Instant::now();
        let long = extended(None, now, Duration::from_secs(60));
        assert_eq!(long, now + Duration::from_secs(60));
        assert_eq!(extended(Some(long), now, Duration::from_secs(1)), long);
        let later = extended(Some(long), now, Duration::from_secs(120));
        assert_eq!(later, now + Duration::from_secs(120));
        let capped = extended(None, now, Duration::MAX);
        assert_eq!(capped, now + MAX_HOLD_OFF);
    }
}
