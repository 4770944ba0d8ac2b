use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn v(text: &str) -> Version {
    Version::parse(text).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn versions_compare_part_by_part_numerically() {
    assert!(v("1.10.0") > v("1.9.3"));
    assert!(v("2") > v("1.99.99"));
    assert_eq!(v("2.1"), v("2.1.0"));
    assert_eq!(v("v1.4.2"), v("1.4.2"));
    assert_eq!(v("1.4.2+build.7"), v("1.4.2"));
    assert!(v("1.4.2.1") > v("1.4.2"));
}

#[test]
fn a_pre_release_is_older_than_its_release_and_ordered_as_semver_orders_them() {
    // The example order of semver.org, section 11.
    let order = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
    ];
    for pair in order.windows(2) {
        assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
    }
}

#[test]
fn malformed_versions_are_refused_with_the_reason() {
    for bad in [
        "",
        "v",
        "1..2",
        "1.2.3.4.5",
        "1.x",
        "1.2-",
        "1.2-rc..1",
        "1.2-rc_1",
        "99999999999",
        "1.0.0-averyveryverylongprerelease",
    ] {
        let error = Version::parse(bad).expect_err(bad);
        assert_eq!(error.given, bad);
        assert!(
            error.to_string().contains("not a release number"),
            "{error}"
        );
    }
}

#[test]
fn versions_print_as_they_parse() {
    assert_eq!(v("v1.4").to_string(), "1.4.0");
    assert_eq!(v("1.4.2.7-rc.1").to_string(), "1.4.2.7-rc.1");
    assert_eq!(v("2.0.0-rc.1").pre_release(), Some("rc.1"));
    assert_eq!(v("2.0.0").pre_release(), None);
}

#[test]
fn priority_outranks_version() {
    let old_preferred = Rank {
        priority: 1,
        version: v("1.0.0"),
    };
    let new = Rank::of_version(v("9.0.0"));
    assert!(old_preferred > new);
    assert!(Rank::of_version(v("1.1")) > Rank::of_version(v("1.0")));
}

#[test]
fn the_best_candidate_is_the_highest_rank_then_the_longest_live() {
    let c = |version, ms| Candidate {
        rank: Rank::of_version(v(version)),
        live_for: Duration::from_millis(ms),
    };
    assert_eq!(best(&[]), None);
    let found = best(&[c("1.0", 900), c("1.1", 5), c("1.1", 40), c("1.0.9", 1)]);
    assert_eq!(found, Some(c("1.1", 40)));
}

fn version() -> impl Strategy<Value = Version> {
    (
        proptest::collection::vec(0u32..12, 1..=4),
        proptest::option::of("(alpha|beta|rc|[0-9]{1,2})(\\.(alpha|[0-9]{1,2})){0,2}"),
    )
        .prop_map(|(parts, pre)| {
            let numbers: Vec<String> = parts.iter().map(u32::to_string).collect();
            let mut text = numbers.join(".");
            if let Some(pre) = pre {
                text = format!("{text}-{pre}");
            }
            v(&text)
        })
}

proptest! {
    /// The order is total and agrees with equality, and printing then parsing keeps a version.
    #[test]
    fn the_version_order_is_a_total_order(a in version(), b in version(), c in version()) {
        prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
        prop_assert_eq!(a.cmp(&b) == Ordering::Equal, a == b);
        if a <= b && b <= c {
            prop_assert!(a <= c);
        }
        prop_assert_eq!(v(&a.to_string()), a);
        // The server's order of the sort keys (byte order) is the version order.
        prop_assert_eq!(a.sort_key().cmp(&b.sort_key()), a.cmp(&b));
    }
}

#[test]
fn each_refusal_names_its_reason_and_the_limits_are_inclusive() {
    let why = |text: &str| Version::parse(text).expect_err(text).why;
    assert_eq!(why("1.x"), "each part must be a decimal number");
    assert_eq!(why("1..2"), "each part must be a decimal number");
    assert_eq!(why("1.2.3.4.5"), "more than four numeric parts");
    assert_eq!(why("99999999999"), "a part is too large");
    let twenty = "a".repeat(MAX_PRE_RELEASE_LEN);
    assert_eq!(
        v(&format!("1.0.0-{twenty}")).pre_release(),
        Some(twenty.as_str())
    );
    assert_eq!(
        why(&format!("1.0.0-{twenty}b")),
        "the pre-release tag is longer than 20 bytes"
    );
    assert_eq!(v("1.2.3.4").parts(), [1, 2, 3, 4]);
    assert_eq!(v("7").parts(), [7, 0, 0, 0]);
}

#[test]
fn versions_and_ranks_print_for_people() {
    assert_eq!(format!("{:?}", v("1.4.0-rc.1")), "Version(1.4.0-rc.1)");
    let rank = Rank {
        priority: 3,
        version: v("2.0"),
    };
    assert_eq!(rank.to_string(), "priority 3 version 2.0.0");
}
