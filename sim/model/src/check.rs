//! Running a model breadth-first to a depth, and the report: one summary line per model, and
//! each discovery as the trace that a core unit test replays.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use crate::engine::{ElectionModel, Mode};

/// The figures of one check.
#[derive(Debug, Clone)]
pub struct Figures {
    /// The model's name.
    pub name: &'static str,
    /// Unique states whose properties were checked.
    pub states: usize,
    /// Unique states generated (those one step beyond the depth are not checked).
    pub generated: usize,
    /// Transitions computed, repeats included: each is one real step of the core machines.
    pub transitions: usize,
    /// The depth (steps from the initial state) checked completely.
    pub depth: usize,
    /// The "always" properties violated.
    pub violated: Vec<&'static str>,
    /// The "sometimes" properties never discovered.
    pub undiscovered: Vec<&'static str>,
    /// How long the check took.
    pub elapsed: Duration,
    /// Whether the checker stopped on its timeout before the depth was complete.
    pub timed_out: bool,
}

impl Figures {
    /// The summary line: `model NAME: states N, depth D, violations V, T s`.
    pub fn line(&self) -> String {
        format!(
            "model {}: states {}, depth {}, violations {}, {:.1} s",
            self.name,
            self.states,
            self.depth,
            self.violated.len(),
            self.elapsed.as_secs_f64()
        )
    }

    /// Whether the check passed: no violation, every "sometimes" discovered, depth complete.
    pub fn passed(&self) -> bool {
        self.violated.is_empty() && self.undiscovered.is_empty() && !self.timed_out
    }

    /// Transitions per second: how many real core steps (with the state clone and hash around
    /// them) the checker ran per second.
    pub fn rate(&self) -> f64 {
        self.transitions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The outcome of a check: its figures and the discoveries explained.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The figures.
    pub figures: Figures,
    /// Each discovery: the property, whether it is a counterexample, and its trace.
    pub discoveries: Vec<(&'static str, bool, Vec<String>)>,
}

impl Outcome {
    /// The trace of the counterexample of `property`, if one was found.
    pub fn counterexample(&self, property: &str) -> Option<&[String]> {
        self.discoveries
            .iter()
            .find(|(name, counter, _)| *name == property && *counter)
            .map(|(_, _, lines)| lines.as_slice())
    }

    /// How many steps the counterexample of `property` has.
    pub fn counterexample_steps(&self, property: &str) -> Option<usize> {
        self.counterexample(property)
            .map(|lines| lines.iter().filter(|l| l.starts_with("step")).count())
    }
}

/// How to run a check.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Steps from the initial state to check completely.
    pub depth: usize,
    /// Checker threads (one gives the shortest counterexample first, and repeatable counts).
    pub threads: usize,
    /// When to give up.
    pub timeout: Duration,
    /// Explain the examples of the "sometimes" properties too.
    pub examples: bool,
    /// Stop at the first counterexample (the sabotage tests).
    pub first_failure: bool,
}

impl Settings {
    /// `depth` steps on two threads, within two minutes.
    pub fn new(depth: usize) -> Self {
        Self {
            depth,
            threads: 2,
            timeout: Duration::from_secs(120),
            examples: false,
            first_failure: false,
        }
    }
}

/// Checks `model` breadth-first as `settings` say; explains the counterexamples (and, when
/// asked, the examples too).
pub fn run<M: Mode>(name: &'static str, model: ElectionModel<M>, settings: Settings) -> Outcome {
    let explored = Arc::clone(&model.explored);
    explored.store(0, Ordering::Relaxed);
    let properties = model.properties();
    let started = Instant::now();
    // stateright counts the initial state as depth 1 and skips (does not check) the states at
    // the target depth: `depth` steps checked is a target of `depth + 2`.
    let Settings {
        depth,
        threads,
        timeout,
        examples,
        first_failure,
    } = settings;
    let finish = if first_failure {
        HasDiscoveries::AnyFailures
    } else {
        HasDiscoveries::All
    };
    let checker = model
        .clone()
        .checker()
        .threads(threads)
        .target_max_depth(depth + 2)
        .timeout(timeout)
        .finish_when(finish)
        .spawn_bfs()
        .join();
    let elapsed = started.elapsed();
    let discoveries = checker.discoveries();
    let mut violated = Vec::new();
    let mut undiscovered = Vec::new();
    let mut explained = Vec::new();
    for property in &properties {
        let found = discoveries.get(property.name);
        let counter = property.expectation != Expectation::Sometimes;
        match (found, counter) {
            (Some(_), true) => violated.push(property.name),
            (None, false) => undiscovered.push(property.name),
            _ => {}
        }
        if let Some(path) = found
            && (counter || examples)
        {
            explained.push((property.name, counter, model.explain(path)));
        }
    }
    let reached = checker.max_depth().saturating_sub(2);
    let timed_out = elapsed >= timeout || (first_failure && !violated.is_empty());
    let figures = Figures {
        name,
        states: explored.load(Ordering::Relaxed),
        generated: checker.unique_state_count(),
        transitions: checker.state_count(),
        depth: if timed_out {
            reached.saturating_sub(1)
        } else {
            reached
        },
        violated,
        undiscovered,
        elapsed,
        timed_out,
    };
    Outcome {
        figures,
        discoveries: explained,
    }
}
