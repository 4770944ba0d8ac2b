//! Who should own which shard: the balanced, sticky assignment computed from one survey.
//!
//! Every replica computes the same plan from the same [`Survey`], and each performs only its
//! own part of it: the shards it gives up and the free shards it takes. Replicas that saw
//! slightly different surveys may plan to take the same free shard; the server grants it to one
//! of them and the other plans again at its next survey, so the plan only has to converge, never
//! to be agreed on.
//!
//! 0. **Standing.** Each member publishes its [`Standing`]: its rank (or none) and whether it
//!    may own shards below the version floor. A ranked member whose version is older than the
//!    survey's floor, and not allowed below it, is *below the floor*: it has cap 0 (it gives up
//!    every shard and takes none) and the space is balanced over the others.
//! 1. **Caps.** With `R` members owning shards and `K` shards, every member may own `⌊K/R⌋`
//!    shards and `K mod R` of them one more. The extra slots go to the best-ranked members
//!    first, then by a fixed hash, so the caps are a function of the membership alone and
//!    every survey of one membership agrees on them (a change of membership may move up to
//!    `K mod R` shards for the sake of the remainder).
//! 2. **Give.** A member over its cap gives up the excess, starting with the shards it ranks
//!    lowest by rendezvous score (the shards another member is likelier to want).
//! 3. **Take.** Free shards (no holder) go, in shard order, each to the best-ranked member with
//!    room under its cap, and among equal ranks to the one that ranks the shard highest by
//!    rendezvous score. A join therefore moves only the joiner's share, a leave only the
//!    leaver's shards, and during a rolling deploy the shards an old replica frees go to the
//!    new versions first. Unranked members rank below every ranked one; a space of equal (or
//!    no) ranks is assigned exactly as without ranks.

use std::cmp::Reverse;

use super::{MemberId, Shard};
use crate::rank::{Rank, Version};

/// What a member publishes beside its membership: its rank ([`ShardOptions::preference`]),
/// and whether it may own shards below the version floor (a deliberate rollback,
/// [`ShardOptions::below_floor`]). The default is an unranked member.
///
/// [`ShardOptions::preference`]: super::ShardOptions::preference
/// [`ShardOptions::below_floor`]: super::ShardOptions::below_floor
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Standing {
    /// The member's rank; `None` for an unranked member.
    pub rank: Option<Rank>,
    /// Whether it owns shards even below the floor.
    pub below_floor_allowed: bool,
}

impl Standing {
    /// Whether a member of this standing is below `floor`: ranked, older than it, and not
    /// allowed below it.
    pub fn is_below(&self, floor: Option<Version>) -> bool {
        match (self.rank, floor) {
            (Some(rank), Some(floor)) => rank.version < floor && !self.below_floor_allowed,
            _ => false,
        }
    }
}

/// What one survey found: the members and every shard's holder.
///
/// Built by [`Survey::new`] from the rows of the survey statement; the invariants (members
/// sorted and unique, one entry per shard, the answering backend known) hold for every value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Survey {
    backend: MemberId,
    members: Vec<MemberId>,
    holders: Vec<Option<MemberId>>,
    /// The members' standings, in member order (unranked unless published).
    standings: Vec<Standing>,
    /// The version floor the survey read, if any.
    floor: Option<Version>,
}

/// Why survey rows do not describe a shard space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SurveyError {
    /// A row names a shard outside `0..count`.
    ShardOutOfRange {
        /// The shard named.
        shard: u32,
        /// The number of shards.
        count: u32,
    },
    /// Two backends hold the same shard: impossible for an exclusive lock, so the rows do not
    /// come from `pg_locks`.
    TwoHolders {
        /// The shard held twice.
        shard: Shard,
    },
}

impl std::fmt::Display for SurveyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ShardOutOfRange { shard, count } => {
                write!(f, "survey row names shard {shard}, outside 0..{count}")
            }
            Self::TwoHolders { shard } => {
                write!(f, "survey rows show two holders of shard {shard}")
            }
        }
    }
}

impl std::error::Error for SurveyError {}

impl Survey {
    /// A survey of `count` shards answered by backend `backend`, from one row per backend
    /// holding a lock of the space: whether it holds the member lock, and the shards it holds.
    ///
    /// # Errors
    /// A shard outside `0..count`, or a shard with two holders.
    pub fn new<S>(
        count: u32,
        backend: MemberId,
        rows: impl IntoIterator<Item = (MemberId, bool, S)>,
    ) -> Result<Self, SurveyError>
    where
        S: IntoIterator<Item = u32>,
    {
        let mut members = Vec::new();
        let mut holders = vec![None; count as usize];
        for (pid, member, shards) in rows {
            if member {
                members.push(pid);
            }
            for shard in shards {
                let slot = holders
                    .get_mut(shard as usize)
                    .ok_or(SurveyError::ShardOutOfRange { shard, count })?;
                if slot.is_some_and(|held: MemberId| held != pid) {
                    return Err(SurveyError::TwoHolders {
                        shard: Shard::new(shard),
                    });
                }
                *slot = Some(pid);
            }
        }
        members.sort_unstable();
        members.dedup();
        let standings = vec![Standing::default(); members.len()];
        Ok(Self {
            backend,
            members,
            holders,
            standings,
            floor: None,
        })
    }

    /// The same survey with the members' published standings; a member not named stays
    /// unranked, and a name that is not a member is ignored.
    #[must_use]
    pub fn with_standings(
        mut self,
        standings: impl IntoIterator<Item = (MemberId, Standing)>,
    ) -> Self {
        for (member, standing) in standings {
            if let Ok(index) = self.members.binary_search(&member) {
                self.standings[index] = standing;
            }
        }
        self
    }

    /// The same survey with the version floor it read.
    #[must_use]
    pub fn with_floor(mut self, floor: Option<Version>) -> Self {
        self.floor = floor;
        self
    }

    /// The version floor the survey read: the newest version that has joined the space, when
    /// the floor is on and one is recorded.
    pub fn floor(&self) -> Option<Version> {
        self.floor
    }

    /// The standing `member` published (unranked when it published none, or is no member).
    pub fn standing(&self, member: MemberId) -> Standing {
        self.members
            .binary_search(&member)
            .map_or(Standing::default(), |index| self.standings[index])
    }

    /// Whether `member` is below the survey's floor, and so owns no shard.
    pub fn is_below_floor(&self, member: MemberId) -> bool {
        self.standing(member).is_below(self.floor)
    }

    /// The backend that answered the survey (`pg_backend_pid()` of the lock session).
    pub fn backend(&self) -> MemberId {
        self.backend
    }

    /// The backends holding the member lock, in ascending order.
    pub fn members(&self) -> &[MemberId] {
        &self.members
    }

    /// How many shards the space has.
    pub fn shard_count(&self) -> u32 {
        // Built from a `u32` count.
        self.holders.len() as u32
    }

    /// The holder of `shard`, if any (a member, or a backend that holds the shard without the
    /// member lock).
    pub fn holder(&self, shard: Shard) -> Option<MemberId> {
        self.holders.get(shard.index()).copied().flatten()
    }

    /// Every shard with its holder, in shard order.
    pub fn holders(&self) -> impl Iterator<Item = (Shard, Option<MemberId>)> + '_ {
        (0u32..)
            .zip(&self.holders)
            .map(|(s, h)| (Shard::new(s), *h))
    }

    /// The shards `member` holds, in shard order.
    pub fn held_by(&self, member: MemberId) -> Vec<Shard> {
        self.holders()
            .filter(|(_, holder)| *holder == Some(member))
            .map(|(shard, _)| shard)
            .collect()
    }

    /// How many shards have a holder.
    pub fn held_count(&self) -> usize {
        self.holders.iter().flatten().count()
    }

    /// Every member with the number of shards it holds, in member order.
    pub fn loads(&self) -> Vec<(MemberId, u32)> {
        self.members
            .iter()
            .map(|&m| {
                let held = self.holders.iter().filter(|h| **h == Some(m)).count();
                (m, u32::try_from(held).unwrap_or(u32::MAX))
            })
            .collect()
    }
}

/// The rendezvous score of `member` for `shard`: the member that scores a shard highest is its
/// preferred owner. A fixed function (SplitMix64's finaliser of the member's, mixed with the
/// shard, finalised again), so replicas of every version agree.
pub fn score(member: MemberId, shard: Shard) -> u64 {
    mix(mix(u64::from(member.get() as u32)) ^ u64::from(shard.get()))
}

fn mix(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Every member's cap in `survey`, in member order: 0 for a member below the floor, and over
/// the `R` others `⌊K/R⌋`, plus one for the `K mod R` best-ranked, then first by a fixed hash
/// of the member (then its id). Empty when there is no member.
///
/// The caps depend on the membership alone, not on who holds what: two members that survey at
/// different moments of one membership agree on every cap, so a free shard planned for one of
/// them by the other's survey stays planned for it (ranking the extra slots by the shards held
/// made a take between two surveys move a slot, and a freed shard could wait a second interval:
/// the simulation's finding 2).
pub fn caps(survey: &Survey) -> Vec<(MemberId, u32)> {
    let members = survey.members();
    let owning: Vec<MemberId> = members
        .iter()
        .copied()
        .filter(|&m| !survey.is_below_floor(m))
        .collect();
    let Ok(owners) = u32::try_from(owning.len()) else {
        return Vec::new();
    };
    let count = survey.shard_count();
    let base = count.checked_div(owners).unwrap_or(0);
    let extra = count.checked_rem(owners).unwrap_or(0) as usize;
    let mut ranked = owning.clone();
    ranked.sort_by_key(|&m| {
        (
            Reverse(survey.standing(m).rank),
            mix(u64::from(m.get() as u32)),
            m,
        )
    });
    let lucky: Vec<MemberId> = ranked.into_iter().take(extra).collect();
    members
        .iter()
        .map(|&m| {
            let cap = if owning.contains(&m) {
                base + u32::from(lucky.contains(&m))
            } else {
                0
            };
            (m, cap)
        })
        .collect()
}

/// One member's part of the assignment computed from a survey.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The member's cap.
    pub cap: u32,
    /// The shards it holds now.
    pub held: u32,
    /// Held shards to give up, lowest rendezvous score first (all of the excess over the cap).
    pub give: Vec<Shard>,
    /// Free shards to take, in shard order.
    pub take: Vec<Shard>,
}

/// The part of the assignment of `survey` that falls to `me`. A `me` that is not a member gets
/// an empty plan that gives up everything it holds.
pub fn plan(survey: &Survey, me: MemberId) -> Plan {
    let caps = caps(survey);
    let loads = survey.loads();
    let mine = survey.held_by(me);
    let held = u32::try_from(mine.len()).unwrap_or(u32::MAX);
    let Some(&(_, cap)) = caps.iter().find(|(m, _)| *m == me) else {
        return Plan {
            cap: 0,
            held,
            give: mine,
            take: Vec::new(),
        };
    };
    // The excess over the cap (none at or under it), lowest score first.
    let mut give = mine;
    give.sort_by_key(|&s| (score(me, s), s));
    give.truncate(held.saturating_sub(cap) as usize);
    let mut room: Vec<(MemberId, u32, Option<Rank>)> = caps
        .iter()
        .zip(&loads)
        .zip(&survey.standings)
        .map(|((&(m, cap), &(_, held)), standing)| (m, cap.saturating_sub(held), standing.rank))
        .collect();
    // Every member's share of the free shards, of which this one keeps its own (none when it
    // has no room).
    let mut take = Vec::new();
    for (shard, holder) in survey.holders() {
        if holder.is_some() {
            continue;
        }
        let Some(best) = room
            .iter_mut()
            .filter(|(_, left, _)| *left > 0)
            .max_by_key(|(m, _, rank)| (*rank, score(*m, shard), Reverse(*m)))
        else {
            break;
        };
        best.1 -= 1;
        if best.0 == me {
            take.push(shard);
        }
    }
    Plan {
        cap,
        held,
        give,
        take,
    }
}
