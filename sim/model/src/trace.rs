//! A counterexample as the inputs each core machine received: the sequence a unit test of the
//! core replays ([`replay`]), printed one line per input.

use std::fmt;
use std::time::Instant;

use plexsphere_leader_core::Machine;

use crate::clock::{Micros, instant};

/// One input given to one replica's machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input<E> {
    /// `start(now)`.
    Start,
    /// `handle_timeout(now)`.
    Timeout,
    /// `handle_event(now, event)`.
    Event(E),
}

impl<E> Input<E> {
    /// Gives the input to `machine` at `now`, the deadlines due fired first when `fire`.
    pub fn give<M: Machine<Event = E>>(self, machine: &mut M, now: Instant, fire: bool) {
        match self {
            Self::Start => {
                let _started = machine.start(now);
            }
            Self::Timeout if fire => machine.handle_timeout(now),
            Self::Timeout => {}
            Self::Event(event) => {
                if fire {
                    machine.handle_timeout(now);
                }
                let _handled = machine.handle_event(now, event);
            }
        }
    }
}

/// One line of a trace: an input at an instant of the replica's own clock, or a step of the
/// environment (what the model checker chose).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line<E> {
    /// The model's step `index`, as the checker chose it.
    Step {
        /// The step's position in the path, from 1.
        index: usize,
        /// The server's clock.
        server: Micros,
        /// The step, as printed.
        step: String,
    },
    /// An input to replica `replica`'s run `run`, at `at` on its clock.
    Input {
        /// The replica's name.
        replica: u8,
        /// Its run.
        run: u32,
        /// Its clock.
        at: Micros,
        /// The input.
        input: Input<E>,
    },
}

impl<E: fmt::Debug> fmt::Display for Line<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Step {
                index,
                server,
                step,
            } => write!(f, "step {index:>2} (server {}): {step}", ms(*server)),
            Self::Input {
                replica,
                run,
                at,
                input,
            } => {
                let call = match input {
                    Input::Start => "start".to_owned(),
                    Input::Timeout => "handle_timeout".to_owned(),
                    Input::Event(event) => format!("handle_event {event:?}"),
                };
                write!(f, "    r{replica}.{run} at {}: {call}", ms(*at))
            }
        }
    }
}

/// `at` as milliseconds, for traces.
pub fn ms(at: Micros) -> String {
    match at % 1_000 {
        0 => format!("{}ms", at / 1_000),
        fraction => format!("{}.{fraction:03}ms", at / 1_000),
    }
}

/// Records the lines of a trace while a path is replayed.
#[derive(Debug)]
pub struct Recorder<E> {
    lines: Vec<Line<E>>,
}

impl<E> Default for Recorder<E> {
    fn default() -> Self {
        Self { lines: Vec::new() }
    }
}

impl<E: Clone> Recorder<E> {
    /// Records a line.
    pub fn push(&mut self, line: Line<E>) {
        self.lines.push(line);
    }

    /// The lines recorded.
    pub fn lines(&self) -> &[Line<E>] {
        &self.lines
    }

    /// The inputs of replica `replica`'s run `run`, with their instants: what [`replay`] feeds.
    pub fn inputs_of(&self, replica: u8, run: u32) -> Vec<(Micros, Input<E>)> {
        self.lines
            .iter()
            .filter_map(|line| match line {
                Line::Input {
                    replica: r,
                    run: n,
                    at,
                    input,
                } if *r == replica && *n == run => Some((*at, input.clone())),
                _ => None,
            })
            .collect()
    }
}

/// Replays `inputs` on `machine` through the [`Machine`] contract (the deadlines due are fired
/// before each event, as the model's driver does), returning the actions each input queued: how
/// a core unit test reproduces one replica's side of a counterexample.
pub fn replay<M: Machine>(
    machine: &mut M,
    inputs: &[(Micros, Input<M::Event>)],
) -> Vec<Vec<M::Action>>
where
    M::Event: Clone,
{
    inputs
        .iter()
        .map(|(at, input)| {
            input.clone().give(machine, instant(*at), true);
            std::iter::from_fn(|| machine.poll_action()).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_print_in_milliseconds() {
        assert_eq!(ms(3_000_000), "3000ms");
        assert_eq!(ms(952_381), "952.381ms");
        assert_eq!(ms(7), "0.007ms");
    }
}
