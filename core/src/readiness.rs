//! The readiness probe of a ticked background loop (the spec's "Readiness" section), as a pure
//! state machine: the adapter records what each pass of the loop did, the probe says what
//! `/readyz` reports. No clock and no I/O: a probe runs no pass of its own.
//!
//! | replica state                  | what the probe reports |
//! |--------------------------------|------------------------|
//! | booted, boot pass not run yet  | not ready: [`ProbeFailure::BootPending`] |
//! | booted, no tick yet            | the boot pass's outcome (pass, or [`ProbeFailure::BootPass`]) |
//! | leader, last tick succeeded    | pass |
//! | leader, last tick failed       | that tick's error ([`ProbeFailure::Tick`] or [`ProbeFailure::Panicked`]) until a later tick succeeds |
//! | standby                        | pass: a standby runs no pass and has no outcome of its own |
//!
//! Consequences, each a unit test below: a demoted leader's probe clears on its first standby
//! tick; a leader whose term ended while its pass ran records a pass (a demotion is never a
//! failed tick); no probe is boot-latched, because every tick replaces the last outcome; a tick
//! cut short by the service's own shutdown changes nothing.
//!
//! Probe texts (stable; scripts may match on them):
//!
//! - `plexsphere: background loop "<loop>": tick panicked: <value>` (fixed by the spec),
//! - `plexsphere: background loop "<loop>": tick failed: <error>`,
//! - `plexsphere: background loop "<loop>": boot pass failed: <error>`,
//! - `plexsphere: background loop "<loop>": boot pass not run yet`.
//!
//! `<loop>` is the loop's name (`access-session-sweep`), never the probe's
//! (`access-session-sweeper`).

use std::fmt;

/// What one tick of a ticked loop did on this replica, as the probe needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tick<E> {
    /// The replica was a standby: no pass ran.
    Standby,
    /// The replica led and the pass returned `Ok` within its term.
    Passed,
    /// The term ended while the pass ran (a demotion or a stop of the election): its result is
    /// discarded and it is not a failure. The replica is no longer leading, so it reports a pass
    /// as a standby does.
    Interrupted,
    /// The replica led and the pass returned this error within its term.
    Failed(E),
    /// The pass panicked with this payload (rendered as text). Always a failed tick.
    Panicked(String),
    /// The service's own shutdown cancelled the tick: the probe keeps what it had.
    Cancelled,
}

impl<E> Tick<E> {
    /// Whether this tick is a failed tick (it writes a WARN line and fails the probe).
    pub fn is_failure(&self) -> bool {
        matches!(self, Self::Failed(_) | Self::Panicked(_))
    }
}

/// Why a probe does not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeFailure<E> {
    /// The boot pass has not run yet: the replica is still booting.
    BootPending,
    /// The boot pass failed, and no tick has run since.
    BootPass(E),
    /// The last tick failed with this error.
    Tick(E),
    /// The last tick panicked with this payload.
    Panicked(String),
}

/// Where the probe stands; the variants carry only what is valid in them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State<E> {
    /// No boot pass recorded.
    Booting,
    /// The boot pass ran; no tick yet.
    Booted(Result<(), E>),
    /// At least one tick ran; the last decisive one failed or passed.
    Ticked(Result<(), ProbeFailure<E>>),
}

/// The readiness state of one ticked loop on one replica.
///
/// Record the boot pass with [`boot`](Self::boot) and every tick with [`tick`](Self::tick), in the
/// order they happen; read the verdict with [`status`](Self::status) or render it with
/// [`report`](Self::report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopReadiness<E> {
    loop_name: String,
    state: State<E>,
}

impl<E> LoopReadiness<E> {
    /// A probe of the loop `loop_name` (the loop's own name, which the probe texts quote) whose
    /// boot pass has not run yet.
    pub fn new(loop_name: impl Into<String>) -> Self {
        Self {
            loop_name: loop_name.into(),
            state: State::Booting,
        }
    }

    /// The loop's name.
    pub fn loop_name(&self) -> &str {
        &self.loop_name
    }

    /// Records the boot pass's outcome. A boot pass recorded after a tick changes nothing: the
    /// tick is newer.
    pub fn boot(&mut self, outcome: Result<(), E>) {
        if matches!(self.state, State::Ticked(_)) {
            return;
        }
        self.state = State::Booted(outcome);
    }

    /// Records one tick.
    pub fn tick(&mut self, tick: Tick<E>) {
        let verdict = match tick {
            Tick::Standby | Tick::Passed | Tick::Interrupted => Ok(()),
            Tick::Failed(error) => Err(ProbeFailure::Tick(error)),
            Tick::Panicked(value) => Err(ProbeFailure::Panicked(value)),
            Tick::Cancelled => return,
        };
        self.state = State::Ticked(verdict);
    }

    /// Whether the probe passes.
    pub fn is_ready(&self) -> bool {
        self.status().is_ok()
    }

    /// The verdict: `Ok(())` when the probe passes, else why not.
    pub fn status(&self) -> Result<(), ProbeFailure<&E>> {
        match &self.state {
            State::Booting => Err(ProbeFailure::BootPending),
            State::Booted(Ok(())) | State::Ticked(Ok(())) => Ok(()),
            State::Booted(Err(error)) => Err(ProbeFailure::BootPass(error)),
            State::Ticked(Err(failure)) => Err(failure.as_ref()),
        }
    }

    /// Whether any tick has been recorded since boot.
    pub fn has_ticked(&self) -> bool {
        matches!(self.state, State::Ticked(_))
    }
}

impl<E: fmt::Display> LoopReadiness<E> {
    /// The verdict as the probe reports it: `Ok(())`, or the probe text of the failure.
    pub fn report(&self) -> Result<(), String> {
        self.status()
            .map_err(|failure| probe_text(&self.loop_name, &failure))
    }
}

impl<E> ProbeFailure<E> {
    fn as_ref(&self) -> ProbeFailure<&E> {
        match self {
            Self::BootPending => ProbeFailure::BootPending,
            Self::BootPass(error) => ProbeFailure::BootPass(error),
            Self::Tick(error) => ProbeFailure::Tick(error),
            Self::Panicked(value) => ProbeFailure::Panicked(value.clone()),
        }
    }
}

/// The probe text of `failure` for the loop `loop_name` (see the module doc for the forms).
pub fn probe_text<E: fmt::Display>(loop_name: &str, failure: &ProbeFailure<E>) -> String {
    let prefix = format!("plexsphere: background loop {loop_name:?}");
    match failure {
        ProbeFailure::BootPending => format!("{prefix}: boot pass not run yet"),
        ProbeFailure::BootPass(error) => format!("{prefix}: boot pass failed: {error}"),
        ProbeFailure::Tick(error) => format!("{prefix}: tick failed: {error}"),
        ProbeFailure::Panicked(value) => format!("{prefix}: tick panicked: {value}"),
    }
}

/// Renders a panic payload as the spec's `<value>`: the message of a `&str` or `String` payload,
/// else a placeholder naming it opaque.
pub fn panic_value(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&'static str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "<non-string panic payload>".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Probe = LoopReadiness<&'static str>;

    fn booted(outcome: Result<(), &'static str>) -> Probe {
        let mut probe = Probe::new("access-session-sweep");
        probe.boot(outcome);
        probe
    }

    #[test]
    fn before_the_boot_pass_the_probe_is_not_ready() {
        let probe = Probe::new("invitations-expire");
        assert_eq!(probe.status(), Err(ProbeFailure::BootPending));
        assert_eq!(
            probe.report(),
            Err("plexsphere: background loop \"invitations-expire\": boot pass not run yet".into())
        );
    }

    #[test]
    fn booted_with_no_tick_reports_a_boot_pass_that_succeeded() {
        assert_eq!(booted(Ok(())).report(), Ok(()));
    }

    #[test]
    fn booted_with_no_tick_reports_a_boot_pass_that_failed_until_the_first_tick() {
        let mut probe = booted(Err("relation missing"));
        assert_eq!(
            probe.status(),
            Err(ProbeFailure::BootPass(&"relation missing"))
        );
        assert_eq!(
            probe.report(),
            Err("plexsphere: background loop \"access-session-sweep\": boot pass failed: relation missing".into())
        );
        probe.tick(Tick::Standby);
        assert!(probe.is_ready(), "the first tick replaces the boot outcome");
    }

    #[test]
    fn leader_whose_last_tick_succeeded_passes() {
        let mut probe = booted(Ok(()));
        probe.tick(Tick::Passed);
        assert_eq!(probe.status(), Ok(()));
    }

    #[test]
    fn leader_whose_last_tick_failed_reports_that_error_until_a_later_tick_succeeds() {
        let mut probe = booted(Ok(()));
        probe.tick(Tick::Failed("deadlock detected"));
        assert_eq!(
            probe.report(),
            Err("plexsphere: background loop \"access-session-sweep\": tick failed: deadlock detected".into())
        );
        probe.tick(Tick::Failed("still down"));
        assert_eq!(probe.status(), Err(ProbeFailure::Tick(&"still down")));
        probe.tick(Tick::Passed);
        assert!(probe.is_ready());
    }

    #[test]
    fn standby_passes_whatever_the_boot_pass_did() {
        for boot in [Ok(()), Err("boot failed")] {
            let mut probe = booted(boot);
            probe.tick(Tick::Standby);
            assert!(probe.is_ready());
        }
    }

    #[test]
    fn a_demoted_leaders_probe_clears_on_its_first_standby_tick() {
        let mut probe = booted(Ok(()));
        probe.tick(Tick::Failed("timeout"));
        assert!(!probe.is_ready());
        probe.tick(Tick::Standby);
        assert!(probe.is_ready());
    }

    #[test]
    fn a_tick_interrupted_by_a_demotion_is_not_a_failure() {
        let mut probe = booted(Ok(()));
        probe.tick(Tick::Failed("x"));
        let interrupted = Tick::Interrupted;
        assert!(!interrupted.is_failure());
        probe.tick(interrupted);
        assert!(probe.is_ready());
    }

    #[test]
    fn a_pass_that_panics_is_a_failed_tick_with_the_spec_text() {
        let mut probe = booted(Ok(()));
        let tick = Tick::Panicked("index out of bounds".to_owned());
        assert!(tick.is_failure());
        probe.tick(tick);
        assert_eq!(
            probe.report(),
            Err(
                "plexsphere: background loop \"access-session-sweep\": tick panicked: index out of bounds"
                    .into()
            ),
            "the loop's name, not the probe's (access-session-sweeper)"
        );
        probe.tick(Tick::Passed);
        assert!(probe.is_ready());
    }

    #[test]
    fn a_tick_cancelled_by_shutdown_changes_nothing() {
        let mut probe = booted(Ok(()));
        probe.tick(Tick::Failed("x"));
        probe.tick(Tick::Cancelled);
        assert_eq!(probe.status(), Err(ProbeFailure::Tick(&"x")));
        let mut fresh = booted(Err("boot"));
        fresh.tick(Tick::Cancelled);
        assert_eq!(fresh.status(), Err(ProbeFailure::BootPass(&"boot")));
        assert!(!fresh.has_ticked());
    }

    #[test]
    fn the_probe_names_its_loop_and_knows_whether_a_tick_ran() {
        let mut probe = booted(Ok(()));
        assert_eq!(probe.loop_name(), "access-session-sweep");
        assert!(!probe.has_ticked());
        probe.tick(Tick::Standby);
        assert!(probe.has_ticked());
    }

    #[test]
    fn a_late_boot_record_never_overrides_a_tick() {
        let mut probe = Probe::new("x");
        probe.tick(Tick::Passed);
        probe.boot(Err("late"));
        assert!(probe.is_ready());
    }

    #[test]
    fn panic_payloads_render_as_text() {
        let payload: Box<dyn std::any::Any + Send> = Box::new("static message");
        assert_eq!(panic_value(payload.as_ref()), "static message");
        let payload: Box<dyn std::any::Any + Send> = Box::new(format!("formatted {}", 7));
        assert_eq!(panic_value(payload.as_ref()), "formatted 7");
        let payload: Box<dyn std::any::Any + Send> = Box::new(42_u8);
        assert_eq!(panic_value(payload.as_ref()), "<non-string panic payload>");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn tick() -> impl Strategy<Value = Tick<u8>> {
            prop_oneof![
                Just(Tick::Standby),
                Just(Tick::Passed),
                Just(Tick::Interrupted),
                any::<u8>().prop_map(Tick::Failed),
                "[a-z]{0,8}".prop_map(Tick::Panicked),
                Just(Tick::Cancelled),
            ]
        }

        /// The reference model: the last tick that was not cancelled decides; before any, the
        /// boot pass does.
        fn model(boot: Option<Result<(), u8>>, ticks: &[Tick<u8>]) -> Result<(), ProbeFailure<u8>> {
            let decisive = ticks.iter().rev().find(|t| !matches!(t, Tick::Cancelled));
            match (decisive, boot) {
                (Some(Tick::Failed(e)), _) => Err(ProbeFailure::Tick(*e)),
                (Some(Tick::Panicked(v)), _) => Err(ProbeFailure::Panicked(v.clone())),
                (Some(_), _) => Ok(()),
                (None, None) => Err(ProbeFailure::BootPending),
                (None, Some(Ok(()))) => Ok(()),
                (None, Some(Err(e))) => Err(ProbeFailure::BootPass(e)),
            }
        }

        proptest! {
            #[test]
            fn the_last_tick_decides_and_nothing_is_boot_latched(
                boot in proptest::option::of(prop_oneof![Just(Ok(())), any::<u8>().prop_map(Err)]),
                ticks in proptest::collection::vec(tick(), 0..24),
            ) {
                let mut probe = LoopReadiness::new("l");
                if let Some(outcome) = boot {
                    probe.boot(outcome);
                }
                for t in &ticks {
                    probe.tick(t.clone());
                }
                let expected = model(boot, &ticks);
                let got = probe.status().map_err(|f| match f {
                    ProbeFailure::BootPending => ProbeFailure::BootPending,
                    ProbeFailure::BootPass(e) => ProbeFailure::BootPass(*e),
                    ProbeFailure::Tick(e) => ProbeFailure::Tick(*e),
                    ProbeFailure::Panicked(v) => ProbeFailure::Panicked(v),
                });
                prop_assert_eq!(got, expected);
                // A success or a standby tick always clears, whatever came before.
                probe.tick(Tick::Standby);
                prop_assert!(probe.is_ready());
            }
        }
    }
}
