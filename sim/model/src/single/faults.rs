//! The faults and the operator's controls, as steps of the model.

use plexsphere_leader_core::{Election, Event};

use super::state::{Cause, State};
use super::world::World;
use crate::flight::Stage;
use crate::server::Sess;
use crate::trace::Input;

impl World<'_> {
    /// Replica `r`'s process dies and starts again. With `fin` the server sees its sockets
    /// close and ends its sessions at once; without (the host vanished), they stay until the
    /// server's `idle_session_timeout` ends them. Its statements still on the wire may arrive.
    pub(crate) fn crash(&mut self, r: usize, fin: bool) {
        let index = u8::try_from(r).unwrap_or(u8::MAX);
        let run = self.s.replicas[r].run;
        let own = |sess: &Sess| sess.replica == index && sess.run == run;
        self.s
            .flights
            .retain(|f| !(own(&f.owner) && matches!(f.stage, Stage::Replied(_))));
        for flight in self.s.flights.iter_mut().filter(|f| own(&f.owner)) {
            flight.abandoned = true;
        }
        if fin {
            let sessions: Vec<Sess> = self
                .s
                .server
                .sessions
                .iter()
                .map(|s| s.owner)
                .filter(own)
                .collect();
            for sess in sessions {
                self.end_session(sess, false);
            }
        }
        let replica = &mut self.s.replicas[r];
        replica.machine = Election::with_options(self.model.options);
        replica.run += 1;
        replica.paused = false;
        replica.lock_conn = None;
        replica.epoch = None;
        replica.lost = None;
        replica.stale = 0;
        if self.s.resigned == Some(index) {
            self.s.resigned = None;
        }
        self.feed(r, Input::Start);
    }

    /// `pg_terminate_backend` of replica `r`'s lock session (else its newest session).
    pub(crate) fn terminate(&mut self, r: usize) {
        if let Some(sess) = self.terminable(r) {
            self.end_session(sess, true);
        }
    }

    /// The session of replica `r` a terminate ends ([`terminable`]).
    pub(crate) fn terminable(&self, r: usize) -> Option<Sess> {
        terminable(self.s, r)
    }

    /// The server restarts (`fin`: its clients see their connections reset) or fails over to a
    /// new primary (no client hears anything; the old primary's sessions are gone). Both lose
    /// what was committed and not yet durable, every session, and the lock table.
    pub(crate) fn restart(&mut self, fin: bool) {
        let sessions: Vec<Sess> = self.s.server.sessions.iter().map(|s| s.owner).collect();
        for sess in sessions {
            self.end_session(sess, fin);
        }
        let server = &mut self.s.server;
        server.waiters.clear();
        server.holder = None;
        server.queued_grant = None;
        server.lease.recover();
        server.fence.recover();
        server.generation += 1;
    }

    /// Replica `r` resumes: its driver fires what fell due while it was paused before anything
    /// else.
    pub(crate) fn resume(&mut self, r: usize) {
        self.s.replicas[r].paused = false;
        self.feed(r, Input::Timeout);
    }

    /// The operator's input `event` to replica `r`.
    pub(crate) fn control(&mut self, r: usize, event: Event<Cause>) {
        self.feed(r, Input::Event(event));
    }
}

/// The session of replica `r` a terminate ends, if it has one: its lock session, else its
/// newest.
pub(crate) fn terminable(s: &State, r: usize) -> Option<Sess> {
    let replica = &s.replicas[r];
    let index = u8::try_from(r).ok()?;
    let mine = |sess: &Sess| sess.replica == index && sess.run == replica.run;
    replica
        .lock_conn
        .map(|conn| replica.sess(r, conn))
        .filter(|sess| s.server.is_open(*sess))
        .or_else(|| s.server.sessions.iter().rev().map(|x| x.owner).find(mine))
}
