//! The pure overlap and gap functions of `plexsphere_leader_tests::timeline`, and the recorder.
#![allow(clippy::unwrap_used)] // Tests: a failed unwrap is a failed test.

use std::time::Duration;

use plexsphere_leader_tests::timeline::{
    intervals_from_events, leaderless_gaps, max_gap, max_overlap, overlaps, total_overlap,
};
use plexsphere_leader_tests::{Interval, Span, Timeline};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Interval of `replica` from `a` ms to `b` ms after `t0`.
fn iv(t0: Instant, replica: &str, a: u64, b: u64) -> Interval {
    Interval {
        replica: replica.to_owned(),
        start: t0 + ms(a),
        end: t0 + ms(b),
    }
}

fn span(t0: Instant, a: u64, b: u64) -> Span {
    Span {
        start: t0 + ms(a),
        end: t0 + ms(b),
    }
}

#[test]
fn no_intervals_no_overlap_and_the_whole_window_is_a_gap() {
    let t0 = Instant::now();
    assert!(overlaps(&[]).is_empty());
    assert_eq!(max_overlap(&[]), Duration::ZERO);
    assert_eq!(
        leaderless_gaps(&[], span(t0, 0, 100)),
        vec![span(t0, 0, 100)]
    );
}

#[test]
fn back_to_back_handover_has_neither_overlap_nor_gap() {
    let t0 = Instant::now();
    let ivs = [iv(t0, "a", 0, 100), iv(t0, "b", 100, 200)];
    assert_eq!(max_overlap(&ivs), Duration::ZERO);
    assert!(leaderless_gaps(&ivs, span(t0, 0, 200)).is_empty());
}

#[test]
fn overlapping_leaders_give_the_shared_span() {
    let t0 = Instant::now();
    let ivs = [iv(t0, "a", 0, 130), iv(t0, "b", 100, 200)];
    assert_eq!(overlaps(&ivs), vec![span(t0, 100, 130)]);
    assert_eq!(max_overlap(&ivs), ms(30));
}

#[test]
fn three_way_overlap_is_one_continuous_span() {
    let t0 = Instant::now();
    // a and b overlap 50..60, b and c 60..80, all three 55..60: one span 50..80.
    let ivs = [
        iv(t0, "a", 0, 60),
        iv(t0, "b", 50, 80),
        iv(t0, "c", 55, 100),
    ];
    assert_eq!(overlaps(&ivs), vec![span(t0, 50, 80)]);
    assert_eq!(max_overlap(&ivs), ms(30));
}

#[test]
fn separate_overlaps_report_the_longest_and_the_total() {
    let t0 = Instant::now();
    let ivs = [
        iv(t0, "a", 0, 110),
        iv(t0, "b", 100, 300),
        iv(t0, "a", 280, 400),
    ];
    assert_eq!(overlaps(&ivs), vec![span(t0, 100, 110), span(t0, 280, 300)]);
    assert_eq!(max_overlap(&ivs), ms(20));
    assert_eq!(total_overlap(&ivs), ms(30));
}

#[test]
fn a_replica_never_overlaps_with_itself() {
    let t0 = Instant::now();
    let ivs = [
        iv(t0, "a", 0, 100),
        iv(t0, "a", 50, 150),
        iv(t0, "a", 150, 160),
    ];
    assert!(overlaps(&ivs).is_empty());
    assert!(leaderless_gaps(&ivs, span(t0, 0, 160)).is_empty());
}

#[test]
fn gaps_are_clipped_to_the_window() {
    let t0 = Instant::now();
    let ivs = [iv(t0, "a", 100, 200), iv(t0, "b", 350, 400)];
    assert_eq!(
        leaderless_gaps(&ivs, span(t0, 0, 500)),
        vec![span(t0, 0, 100), span(t0, 200, 350), span(t0, 400, 500)]
    );
    assert_eq!(
        leaderless_gaps(&ivs, span(t0, 150, 380)),
        vec![span(t0, 200, 350)]
    );
    assert_eq!(max_gap(&ivs, span(t0, 0, 500)), ms(150));
    assert!(leaderless_gaps(&ivs, span(t0, 120, 120)).is_empty());
}

#[test]
fn empty_and_inverted_intervals_are_ignored() {
    let t0 = Instant::now();
    let ivs = [iv(t0, "a", 50, 50), iv(t0, "b", 0, 100)];
    let inverted = Interval {
        replica: "c".to_owned(),
        start: t0 + ms(90),
        end: t0 + ms(10),
    };
    let mut all = ivs.to_vec();
    all.push(inverted);
    assert!(overlaps(&all).is_empty());
}

#[test]
fn events_pair_into_intervals_per_replica() {
    let t0 = Instant::now();
    let tl = Timeline::new();
    tl.record_at(t0 + ms(0), "a", "lead");
    tl.record_at(t0 + ms(10), "b", "follow"); // an end without a begin: ignored
    tl.record_at(t0 + ms(20), "a", "lead"); // already leading: ignored
    tl.record_at(t0 + ms(100), "a", "follow");
    tl.record_at(t0 + ms(90), "b", "lead"); // recorded out of order
    tl.record_at(t0 + ms(150), "a", "lead");
    let ivs = tl.intervals("lead", "follow", t0 + ms(300));
    assert_eq!(
        ivs,
        vec![
            iv(t0, "a", 0, 100),
            iv(t0, "b", 90, 300),
            iv(t0, "a", 150, 300)
        ]
    );
    assert_eq!(overlaps(&ivs), vec![span(t0, 90, 100), span(t0, 150, 300)]);
    assert_eq!(
        intervals_from_events(&tl.events(), "lead", "follow", t0 + ms(300)),
        ivs
    );
}

#[tokio::test]
async fn the_recorder_merges_events_from_many_tasks_in_time_order() {
    let tl = Timeline::new();
    let mut tasks = Vec::new();
    for r in 0..4 {
        let tl = tl.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                tl.record(format!("r{r}"), format!("e{i}"));
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let events = tl.events();
    assert_eq!(events.len(), 100);
    assert!(events.windows(2).all(|w| w[0].at <= w[1].at));
    let r2 = tl.events_of("r2");
    let names: Vec<&str> = r2.iter().map(|e| e.event.as_str()).collect();
    let expected: Vec<String> = (0..25).map(|i| format!("e{i}")).collect();
    assert_eq!(names, expected);
}
