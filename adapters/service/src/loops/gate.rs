//! Gates: the leader-only part of a loop that runs on every replica.

use std::fmt;
use std::sync::Arc;

use plexsphere_leader_core::supervision::gate_allows;

use plexsphere_leader::Elector;

/// A predicate an every-replica loop asks before its gated part (the spec's
/// `capacity.WithCrossingGate`, `services.WithDurableDeletion`).
///
/// A gate built with a predicate allows only while it holds; a gate given no predicate stays
/// open, so a single-replica deployment, a test, or any wiring without an Elector does
/// everything.
#[derive(Clone, Default)]
pub struct Gate {
    predicate: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

impl Gate {
    /// A gate with no predicate: always open.
    pub fn open() -> Self {
        Self::default()
    }

    /// A gate that allows while `predicate` holds.
    pub fn when(predicate: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self {
            predicate: Some(Arc::new(predicate)),
        }
    }

    /// A gate that allows while `elector` leads (its `is_leader`).
    pub fn leader(elector: &Elector) -> Self {
        let elector = elector.clone();
        Self::when(move || elector.is_leader())
    }

    /// The leader gate of `elector`, or an open gate without one.
    pub fn for_elector(elector: Option<&Elector>) -> Self {
        elector.map_or_else(Self::open, Self::leader)
    }

    /// Whether the gated part may run now.
    pub fn allows(&self) -> bool {
        gate_allows(self.predicate.as_ref().map(|predicate| predicate()))
    }

    /// Whether the gate has a predicate.
    pub fn has_predicate(&self) -> bool {
        self.predicate.is_some()
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("has_predicate", &self.has_predicate())
            .field("allows", &self.allows())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn a_gate_without_predicate_stays_open() {
        let gate = Gate::open();
        assert!(!gate.has_predicate());
        assert!(gate.allows());
        assert!(Gate::default().allows());
    }

    #[test]
    fn a_gate_with_a_predicate_allows_only_while_it_holds() {
        let leading = Arc::new(AtomicBool::new(false));
        let gate = Gate::when({
            let leading = Arc::clone(&leading);
            move || leading.load(Ordering::SeqCst)
        });
        assert!(!gate.allows());
        leading.store(true, Ordering::SeqCst);
        assert!(gate.allows());
        leading.store(false, Ordering::SeqCst);
        assert!(!gate.clone().allows());
    }
}
