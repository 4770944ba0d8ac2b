//! The preferred leader ([`Options::preference`]), whatever the mechanism: a standby surveys
//! the candidates before each attempt and defers to a better-ranked live one; the leader
//! surveys them after each check that proved its hold and yields to the best once it outranks
//! the leader and has been live for the window `W`, and the leader has led for `W` (no
//! flapping: at most one yield per `W`). A candidate that vanishes during `W` is simply not in the
//! next survey: the preemption it would have caused never comes.

use super::*;

/// How many intervals past the defer limit a better candidate that took the lock may still be
/// surveyed as live: a candidacy stays live two intervals after its last survey (the
/// adapters' `LIVE_INTERVALS`), and one more covers its take-over's own check after the
/// leader's yield. A candidacy live for longer than the limit and these intervals is one still
/// published: a standby that could not take over.
const TAKEN_OVER_VISIBLE_INTERVALS: u32 = 3;

impl<C> Election<C> {
    /// A standby's steps before its attempt on `conn` (the advisory lock's borrowed connection,
    /// or the fitness probe's operation with a lease) are over but the survey: it runs when
    /// the election ranks candidates, else the attempt goes on at once.
    pub(super) fn prepare_attempt(&mut self, now: Instant, conn: ConnId) {
        match self.options.rank_of() {
            Some(rank) => {
                let borrowed = self.answered_leaves_conn().then_some(conn);
                let role = self.survey_before_attempt(now, borrowed, rank);
                self.set_role(role);
            }
            None => self.attempt(now, conn),
        }
    }

    /// The standby's survey, publishing its candidacy at `rank`: on the `borrowed` connection
    /// (advisory lock), or as an operation of its own (lease).
    pub(super) fn survey_before_attempt(
        &mut self,
        now: Instant,
        borrowed: Option<ConnId>,
        rank: Rank,
    ) -> Role {
        let unbroken = self.interval().get() * 2;
        let conn = borrowed.unwrap_or_else(|| self.next_conn());
        let mut since = now;
        if let State::Running(running) = &mut self.state {
            if let Some((began, last)) = running.candidacy
                && now.saturating_duration_since(last) <= unbroken
            {
                since = began;
            }
            running.candidacy = Some((since, now));
        }
        self.push(Action::SurveyCandidates {
            conn,
            publish: Some(Candidate {
                rank,
                live_for: now.saturating_duration_since(since),
            }),
            floor: self.options.floor_step(false),
        });
        Role::Standby(Standby::Probing {
            conn,
            deadline: now + self.interval().get(),
            step: Step::Survey,
        })
    }

    /// The leader's check proved its hold (and its fitness probe passed): the survey runs
    /// within the check's `deadline` when the election ranks candidates, on the lock session
    /// or (a lease) as an operation of its own; else the next check is awaited.
    pub(super) fn after_verified(&mut self, now: Instant, deadline: Instant) {
        let Some(hold) = self.leader_mut().map(|leader| leader.hold) else {
            return;
        };
        if self.options.rank_of().is_none() {
            self.after_leader_check(now);
            return;
        }
        let conn = match hold.session_conn() {
            Some(session) => session,
            None => self.next_conn(),
        };
        self.push(Action::SurveyCandidates {
            conn,
            publish: None,
            floor: self.options.floor_step(true),
        });
        if let Some(leader) = self.leader_mut() {
            leader.check = LeaderCheck::Probing {
                conn,
                deadline,
                step: Step::Survey,
            };
        }
    }

    /// The survey answered with the live `candidates` other than this replica, and the
    /// version `floor`.
    pub(super) fn on_surveyed(
        &mut self,
        now: Instant,
        conn: ConnId,
        candidates: &[Candidate],
        floor: Option<Version>,
    ) {
        let (Some(mine), State::Running(running)) = (self.options.rank_of(), &self.state) else {
            return;
        };
        let better = rank::best(candidates).filter(|best| best.rank > mine);
        match running.role {
            Role::Leader(_) => {
                if self.below_floor(mine, floor) {
                    // Granted on an attempt begun before a newer leader raised the floor.
                    self.yield_below_floor(now);
                } else {
                    self.leader_surveyed(now, mine, better);
                }
            }
            Role::Standby(_) => {
                if self.below_floor(mine, floor) {
                    self.give_back_answered(conn);
                    self.wait_as_standby(now);
                } else {
                    self.standby_surveyed(now, conn, mine, better);
                }
            }
            Role::Draining(_) | Role::Releasing(_) => {}
        }
    }

    /// A leader found below the floor gives its term up ([`TermEndCause::Yielded`]) and stays a
    /// standby.
    fn yield_below_floor(&mut self, now: Instant) {
        let Some(leader) = self.leader_mut() else {
            return;
        };
        // The survey answered: nothing is left in flight on its connection.
        leader.check = LeaderCheck::Waiting { next_check: now };
        let term = leader.term;
        self.give_up(
            now,
            term,
            TermEndCause::Yielded,
            AfterRelease::Standby(TermEndCause::Yielded),
        );
    }

    /// Whether this replica's version is older than the `floor` (and it may not lead below
    /// it); said once at WARN as it falls below, and once at INFO when it is no longer.
    fn below_floor(&mut self, mine: Rank, floor: Option<Version>) -> bool {
        let below =
            !self.options.may_lead_below_floor() && floor.is_some_and(|floor| floor > mine.version);
        let State::Running(running) = &mut self.state else {
            return false;
        };
        let was = std::mem::replace(&mut running.below_floor, below);
        match (was, below, floor) {
            (false, true, Some(floor)) => self.log(
                LogKind::BelowFloor,
                None,
                Some(Cause::BelowFloor {
                    floor,
                    mine: mine.version,
                }),
            ),
            (true, false, _) => self.log(LogKind::AboveFloorAgain, None, None),
            _ => {}
        }
        below
    }

    /// Whether the last survey found this replica older than the version floor
    /// ([`Options::version_floor`]): it makes no attempt.
    pub fn is_below_floor(&self) -> bool {
        matches!(&self.state, State::Running(running) if running.below_floor)
    }

    /// The leader's survey found `better`, the best candidate when it outranks this replica:
    /// the leader yields once the window allows it, else its next check comes when the window
    /// would be over (if before the regular one), so the yield is late by a round trip at most.
    fn leader_surveyed(&mut self, now: Instant, mine: Rank, better: Option<Candidate>) {
        let window = self.options.preempt_window_of();
        let Some(leader) = self.leader_mut() else {
            return;
        };
        // The survey answered: nothing is left in flight on its connection.
        leader.check = LeaderCheck::Waiting { next_check: now };
        let Some(best) = better else {
            self.after_leader_check(now);
            return;
        };
        let (term, led_for) = (leader.term, now.saturating_duration_since(leader.since));
        // The tenure also bounds the yields: a replica leads a window before each of its
        // yields, and every term after a yield begins after it, so the fleet yields at most
        // once per window.
        let wait = window
            .saturating_sub(best.live_for)
            .max(window.saturating_sub(led_for));
        if wait.is_zero() {
            self.log(
                LogKind::Yielded,
                Some(term),
                Some(Cause::Outranked { by: best, mine }),
            );
            self.give_up(
                now,
                term,
                TermEndCause::Yielded,
                AfterRelease::Standby(TermEndCause::Yielded),
            );
            return;
        }
        let next_check = self.next_check(now).min(now + wait);
        if let Some(leader) = self.leader_mut() {
            leader.check = LeaderCheck::Waiting { next_check };
        }
    }

    /// The standby's survey found `better`, the best candidate when it outranks this replica:
    /// the standby defers (its connection goes back unchanged) for at most
    /// [`Options::defer_limit`], then attempts again; with none better it attempts on `conn`.
    fn standby_surveyed(
        &mut self,
        now: Instant,
        conn: ConnId,
        mine: Rank,
        better: Option<Candidate>,
    ) {
        let limit = self.options.defer_limit();
        let stale_for = self.interval().get() * TAKEN_OVER_VISIBLE_INTERVALS;
        let State::Running(running) = &mut self.state else {
            return;
        };
        let Some(best) = better else {
            running.deferral = None;
            self.attempt(now, conn);
            return;
        };
        let new = !matches!(running.deferral, Some(deferral) if deferral.to == best.rank);
        if new {
            running.deferral = Some(Deferral {
                to: best.rank,
                since: now,
                over: false,
                said: false,
                owed: None,
                led: false,
            });
        }
        let Some(deferral) = running.deferral.as_mut() else {
            return;
        };
        // The limit counts while the candidate deferred to has been live: one that restarted
        // (a candidacy younger than the deferral) may still take over, so it gets the whole
        // limit again, and a standby past it does not queue ahead of its first attempts.
        if let Some(live_since) = now.checked_sub(best.live_for) {
            deferral.since = deferral.since.max(live_since);
        }
        let since = deferral.since;
        let outranked = || Some(Cause::Outranked { by: best, mine });
        let deferred_for = now.saturating_duration_since(since);
        deferral.over = deferred_for >= limit;
        // Past the limit, a candidate still surveyed may be one that took over meanwhile: it
        // stops publishing but stays visible for a while. The limit's passing is said at the
        // attempt only when the candidacy has lasted longer than such a leftover can and no
        // attempt found a leader meanwhile; else it is owed, and said only if the attempt is
        // granted (the lock was free after all).
        let proven = best.live_for > limit + stale_for && !deferral.led;
        let say = deferral.over && !deferral.said && proven;
        deferral.said |= say;
        if deferred_for < limit {
            self.give_back_answered(conn);
            if new {
                self.log(LogKind::Deferring, None, outranked());
            }
            self.wait_as_standby(now);
            return;
        }
        // Past the limit: owed unless said (a grant says it, once: `granted_past_defer_limit`).
        deferral.owed = Some(best);
        if say {
            self.log(LogKind::DeferLimitReached, None, outranked());
        }
        self.attempt(now, conn);
    }

    /// An attempt past the defer limit found the lock (or lease) held by another replica: a
    /// leader exists, so the better candidate's not taking over leaves nobody without one, and
    /// the deferral begins anew. Without this, a standby past its limit would take the lock at
    /// the next release before the better candidate (a move to a worse rank, then a yield back).
    pub(super) fn held_by_another(&mut self, now: Instant) {
        if let State::Running(Running {
            deferral: Some(deferral),
            ..
        }) = &mut self.state
            && deferral.over
        {
            // `over` is recomputed by the next survey, before anything reads it again.
            deferral.since = now;
            // A leader exists, perhaps the candidate itself: nothing to say.
            deferral.owed = None;
            deferral.led = true;
        }
    }

    /// A term begins: when it was granted to an attempt past the defer limit whose saying was
    /// owed, the candidate deferred to did not hold the lock after all, and that is said now,
    /// once.
    pub(super) fn granted_past_defer_limit(&mut self) {
        let Some(mine) = self.options.rank_of() else {
            return;
        };
        let State::Running(Running {
            deferral: Some(deferral),
            ..
        }) = &mut self.state
        else {
            return;
        };
        let Some(best) = deferral.owed.take() else {
            return;
        };
        if deferral.said {
            return;
        }
        deferral.said = true;
        self.log(
            LogKind::DeferLimitReached,
            None,
            Some(Cause::Outranked { by: best, mine }),
        );
    }

    /// Whether this standby's last survey found a better candidate and its defer limit past.
    pub(super) fn past_defer_limit(&self) -> bool {
        matches!(
            &self.state,
            State::Running(Running {
                deferral: Some(Deferral { over: true, .. }),
                ..
            })
        )
    }

    /// The rank of the candidate this standby defers to, while it defers.
    pub fn deferring_to(&self, now: Instant) -> Option<Rank> {
        match &self.state {
            State::Running(Running {
                role: Role::Standby(_),
                deferral: Some(deferral),
                ..
            }) if now.saturating_duration_since(deferral.since) < self.options.defer_limit() => {
                Some(deferral.to)
            }
            _ => None,
        }
    }
}
