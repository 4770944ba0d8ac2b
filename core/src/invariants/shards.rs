//! A checker of the sharded election's safety properties over a trace, beside the election's
//! [`Checker`]: the shard property world and the `shards` fuzz target share
//! it. The rules every machine is held to (steps, starts, ignored inputs, nothing after
//! `Finish`, the next deadline) are the election checker's own, written once for both.
//!
//! Properties checked, besides those:
//! - a shard has at most one open term; term ids strictly increase; every `EndTerm` ends the
//!   shard's open term, with cause `Stopped` only on a stop request, `Resigned` only on a
//!   resign request or when the replica was made ineligible, `HandedOver` only in answer to a
//!   survey, and `Lost(Panicked)`/`Lost(Dropped)` exactly on a panic or a drop;
//! - a take never names a shard with an open term, an unlock never names one;
//! - `AwaitWork` and `ReportOverdueWork` only for an ended term, the latter at most once;
//! - a run finishes with no term open.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

#[cfg(test)]
use super::Violation;
use super::{Checker, Input, Rules};
use crate::cause::{LossReason, TermEndCause};
use crate::ids::TermId;
use crate::shards::{Shard, ShardAction, ShardEvent};

/// Checks a sharded election's trace step by step (a fresh one: `ShardChecker::default()`).
/// See the module documentation.
pub type ShardChecker = Checker<ShardRules>;

/// The sharded election's own rules (see the module documentation).
#[derive(Debug, Default)]
pub struct ShardRules {
    open: BTreeMap<Shard, TermId>,
    last_term: Option<TermId>,
    ended: BTreeSet<TermId>,
    reported: BTreeSet<TermId>,
}

impl ShardChecker {
    /// The open terms of the trace seen so far, by shard (what
    /// [`ShardedElection::owned`](crate::shards::ShardedElection::owned) must say).
    pub fn open_terms(&self) -> Vec<(Shard, TermId)> {
        self.rules.open.iter().map(|(s, t)| (*s, *t)).collect()
    }
}

impl Rules for ShardRules {
    type Event<C> = ShardEvent<C>;
    type Action<C> = ShardAction<C>;
    const ALWAYS_A_DEADLINE: bool = false;

    fn input<C>(&mut self, _now: Instant, _input: &Input<'_, ShardEvent<C>>) -> Result<(), String> {
        Ok(())
    }

    fn action<C>(
        &mut self,
        input: &Input<'_, ShardEvent<C>>,
        action: &ShardAction<C>,
    ) -> Result<bool, String> {
        let event = match input {
            Input::Event { event, .. } => Some(*event),
            _ => None,
        };
        self.check_action(event, action)?;
        Ok(matches!(action, ShardAction::Finish))
    }

    fn deadline<C>(
        &self,
        _now: Instant,
        _input: &Input<'_, ShardEvent<C>>,
        _poll_timeout: Option<Instant>,
    ) -> Result<(), String> {
        Ok(())
    }
}

impl ShardRules {
    fn check_action<C>(
        &mut self,
        event: Option<&ShardEvent<C>>,
        action: &ShardAction<C>,
    ) -> Result<(), String> {
        match action {
            ShardAction::BeginTerm { shard, term, .. } => {
                if let Some(open) = self.open.get(shard) {
                    return Err(format!(
                        "term {term} of shard {shard} began while {open} is open"
                    ));
                }
                if self.last_term.is_some_and(|last| *term <= last) {
                    return Err(format!("term {term} does not increase"));
                }
                self.open.insert(*shard, *term);
                self.last_term = Some(*term);
            }
            ShardAction::EndTerm { shard, term, cause } => {
                if self.open.get(shard) != Some(term) {
                    return Err(format!(
                        "EndTerm {term} of shard {shard}, but its open term is {:?}",
                        self.open.get(shard)
                    ));
                }
                check_end(event, *cause)?;
                self.open.remove(shard);
                self.ended.insert(*term);
            }
            ShardAction::Take { shards, .. } | ShardAction::TakeLeases { shards, .. } => {
                if let Some(shard) = shards.iter().find(|s| self.open.contains_key(s)) {
                    return Err(format!("take of shard {shard}, whose term is open"));
                }
            }
            ShardAction::Unlock { shards, .. } => {
                if let Some(shard) = shards.iter().find(|s| self.open.contains_key(s)) {
                    return Err(format!("unlock of shard {shard}, whose term is open"));
                }
            }
            ShardAction::AwaitWork { term } if !self.ended.contains(term) => {
                return Err(format!("AwaitWork {term} of a term that has not ended"));
            }
            ShardAction::ReportOverdueWork { term, .. } => {
                if !self.ended.contains(term) {
                    return Err(format!(
                        "ReportOverdueWork {term} of a term that has not ended"
                    ));
                }
                if !self.reported.insert(*term) {
                    return Err(format!("ReportOverdueWork {term} twice"));
                }
            }
            ShardAction::Finish => {
                if let Some((shard, term)) = self.open.iter().next() {
                    return Err(format!("finished with term {term} of shard {shard} open"));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Whether a term may end with `cause` in answer to `event` (`None`: a timeout or a start).
fn check_end<C>(event: Option<&ShardEvent<C>>, cause: TermEndCause) -> Result<(), String> {
    let asked = match event {
        Some(ShardEvent::Control(control)) => control.term_end(),
        _ => None,
    };
    let survey = matches!(event, Some(ShardEvent::Surveyed { .. }));
    let abandon = match asked {
        Some(TermEndCause::Lost(reason)) => Some(reason),
        _ => None,
    };
    let allowed = match cause {
        TermEndCause::Stopped | TermEndCause::Resigned => asked == Some(cause),
        // Sharded elections do not probe their fitness nor rank their members.
        TermEndCause::Unfit | TermEndCause::Yielded => false,
        TermEndCause::HandedOver => survey,
        TermEndCause::Lost(reason) => match abandon {
            Some(abandoned) => reason == abandoned,
            None => !matches!(reason, LossReason::Panicked | LossReason::Dropped),
        },
    };
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "EndTerm cause {cause:?} in answer to {}",
            name(event)
        ))
    }
}

fn name<C>(event: Option<&ShardEvent<C>>) -> &'static str {
    match event {
        None => "a timeout or start",
        Some(ShardEvent::Control(control)) => control.name(),
        Some(ShardEvent::Surveyed { .. }) => "Surveyed",
        Some(_) => "a completion",
    }
}

#[cfg(test)]
mod tests;
