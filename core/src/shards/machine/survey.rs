//! The survey and what follows from it: the plan's handovers and takes, the terms begun on the
//! shards granted (after their epochs, with fencing), and the unlocks of handed-over shards.

use super::*;

impl<C> ShardedElection<C> {
    pub(super) fn surveyed(&mut self, now: Instant, survey: Survey) -> Handled {
        let options = self.options;
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if !matches!(open.busy, Some((Op::Survey, _))) {
            return Handled::Ignored(Ignored::Unexpected);
        }
        open.busy = None;
        open.joined_floor = true;
        let backend = open.backend;
        let joined_at = open.joined_at;
        if survey.backend() != backend {
            self.lose(now, LossReason::BackendChanged, None);
            return Handled::Applied;
        }
        if run.stop.is_some() {
            // Stopping: the stopped shards' terms ended but their locks stay until their work
            // returned and every lock is released at once; nothing is taken or given any more.
            self.last_survey = Some(survey);
            self.pump(now);
            return Handled::Applied;
        }
        let believed: Vec<Shard> = run
            .owned
            .keys()
            .chain(run.handing.keys())
            .chain(&run.release)
            .copied()
            .collect();
        let mut believed = believed;
        believed.sort_unstable();
        if !survey.members().contains(&backend) || survey.held_by(backend) != believed {
            self.lose(now, LossReason::LockNotHeld, None);
            return Handled::Applied;
        }
        if let Session::Open(open) = &mut run.session {
            open.verified_at = now;
        }
        // Windows are measured from the grid time of the check, so that a window of one
        // interval ends exactly at the next check.
        let checked_at = run.schedule.current();
        if survey.members() != run.members.as_slice() {
            run.members = survey.members().to_vec();
            run.members_since = checked_at;
        }
        self.note_floor(&survey, backend);
        let run = self.run();
        if run.stop.is_none() {
            let plan = crate::shards::plan(&survey, backend);
            if now >= run.members_since + options.delay() {
                let excess = plan.held.saturating_sub(plan.cap) as usize;
                let room = excess.saturating_sub(run.handing.len());
                let give: Vec<Shard> = plan
                    .give
                    .iter()
                    .copied()
                    .filter(|s| run.owned.contains_key(s))
                    .take(room.min(options.moves() as usize))
                    .collect();
                self.hand_over(now, &give);
            }
            let run = self.run();
            let cold = survey.held_count() == 0 && now < joined_at + options.delay();
            run.settled =
                !cold && plan.held == plan.cap && plan.take.is_empty() && run.handing.is_empty();
            if !cold {
                run.pending_take = plan.take;
            }
        }
        self.last_survey = Some(survey);
        self.pump(now);
        Handled::Applied
    }

    /// Says once, as the survey shows it, that this replica fell below the version floor (and
    /// owns no shard), or is above it again.
    fn note_floor(&mut self, survey: &Survey, backend: MemberId) {
        let below = survey.is_below_floor(backend);
        if below == self.below_floor {
            return;
        }
        self.below_floor = below;
        let kind = if below {
            ShardLogKind::BelowFloor
        } else {
            ShardLogKind::AboveFloorAgain
        };
        let mut log = ShardLog::new(kind, 0);
        if let (true, Some(floor), Some(rank)) = (below, survey.floor(), self.options.rank_of()) {
            log.cause = Some(Cause::BelowFloor {
                floor,
                mine: rank.version,
            });
        }
        self.log(log);
    }

    pub(super) fn hand_over(&mut self, now: Instant, shards: &[Shard]) {
        if shards.is_empty() {
            return;
        }
        let grace = self.options.handover();
        for &shard in shards {
            let run = self.run();
            let Some(term) = run.owned.remove(&shard) else {
                continue;
            };
            run.handing.insert(
                shard,
                Handover {
                    term,
                    overdue_at: now + grace,
                    drained: false,
                    warned: false,
                },
            );
            self.end_term(Some(now), shard, term, TermEndCause::HandedOver);
            self.actions.push_back(ShardAction::AwaitWork { term });
        }
        self.log(ShardLog::new(ShardLogKind::HandingOver, shards.len()));
    }

    pub(super) fn took(&mut self, now: Instant, granted: Vec<Shard>) -> Handled {
        let options = self.options;
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let Some((Op::Take(asked), _)) = open.busy.take() else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let stopping = run.stop.is_some();
        let granted: Vec<Shard> = granted.into_iter().filter(|s| asked.contains(s)).collect();
        if stopping || granted.is_empty() {
            // Stopping: the release of every lock follows, and no term begins.
            self.pump(now);
            return Handled::Applied;
        }
        if options.is_fencing() {
            // Before anything else the session might run: the grant waits for its epochs.
            self.issue(Op::Fence(granted), now + options.interval().get());
            return Handled::Applied;
        }
        self.begin_terms(granted.into_iter().map(|shard| (shard, None)));
        self.pump(now);
        Handled::Applied
    }

    pub(super) fn begin_terms(&mut self, shards: impl IntoIterator<Item = (Shard, Option<u64>)>) {
        let mut began = 0;
        for (shard, epoch) in shards {
            let term = self.next_term();
            self.run().owned.insert(shard, term);
            self.actions
                .push_back(ShardAction::BeginTerm { shard, term, epoch });
            began += 1;
        }
        if began > 0 {
            self.log(ShardLog::new(ShardLogKind::Took, began));
        }
    }

    pub(super) fn epochs_advanced(&mut self, now: Instant, epochs: &[(Shard, u64)]) -> Handled {
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let Some((Op::Fence(asked), _)) = open.busy.take() else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        if run.stop.is_some() {
            self.pump(now);
            return Handled::Applied;
        }
        let epoch_of = |shard: Shard| epochs.iter().find(|(s, _)| *s == shard).map(|e| e.1);
        let (fenced, unfenced): (Vec<Shard>, Vec<Shard>) =
            asked.iter().partition(|&&shard| epoch_of(shard).is_some());
        self.begin_terms(fenced.into_iter().map(|shard| (shard, epoch_of(shard))));
        if !unfenced.is_empty() {
            self.fencing_failed(unfenced, None);
        }
        self.pump(now);
        Handled::Applied
    }

    /// Granted shards whose epochs were not advanced: no term begins; their locks are released
    /// at the next chance and taken again at a later survey.
    pub(super) fn fencing_failed(&mut self, shards: Vec<Shard>, cause: Option<Cause<C>>) {
        let mut log = ShardLog::new(ShardLogKind::FencingFailed, shards.len());
        log.cause = cause;
        self.run().release.extend(shards);
        self.log(log);
    }

    pub(super) fn unlocked(&mut self, now: Instant, not_held: Vec<Shard>) -> Handled {
        let run = self.run();
        let Session::Open(open) = &mut run.session else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let Some((Op::Unlock(shards), _)) = open.busy.take() else {
            return Handled::Ignored(Ignored::Unexpected);
        };
        let mut handed = 0;
        for shard in &shards {
            handed += usize::from(run.handing.remove(shard).is_some());
            run.release.remove(shard);
        }
        // While stopping, the release of every lock follows once the work returned: a lock
        // found missing changes nothing of that.
        if !not_held.is_empty() && run.stop.is_none() {
            self.lose(now, LossReason::LockNotHeld, Some(Cause::LockNotHeld));
            return Handled::Applied;
        }
        if handed > 0 {
            self.log(ShardLog::new(ShardLogKind::HandedOver, handed));
        }
        self.pump(now);
        Handled::Applied
    }

    /// The shards of the fencing statement in flight, taken out of it.
    pub(super) fn fencing(&mut self) -> Option<Vec<Shard>> {
        let Session::Open(open) = &mut self.run().session else {
            return None;
        };
        match open.busy.take() {
            Some((Op::Fence(asked), _)) => Some(asked),
            other => {
                open.busy = other;
                None
            }
        }
    }
}
