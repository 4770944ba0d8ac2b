//! Deliberately broken behaviours, to see the checker fail: the adapter's driver sabotages
//! (its test-only `sabotage` feature) and the simulation's own. A run that checks the real
//! adapter switches none on.

use std::fmt;

pub use plexsphere_leader::sabotage::Sabotage as DriverSabotage;

/// One deliberately broken behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sabotage {
    /// A broken driver behaviour of the adapter (`Config::sabotage`).
    Driver(DriverSabotage),
    /// Both simulated servers read the fence row `FOR SHARE` without locking it
    /// ([`ServerConfig::with_row_locks`](crate::server::ServerConfig::with_row_locks)), so a
    /// new leader's epoch advance does not wait for an old leader's fenced transaction: the
    /// fence-holds property must catch it in fencing runs.
    FenceWithoutRowLock,
}

impl Sabotage {
    /// Every sabotage, for the CLI and the checker-must-fail test.
    pub const ALL: [Self; 6] = [
        Self::Driver(DriverSabotage::NeverPing),
        Self::Driver(DriverSabotage::ReturnGrantedToPool),
        Self::Driver(DriverSabotage::SkipIdleSessionTimeout),
        Self::Driver(DriverSabotage::KeepTermOnFailedPing),
        Self::Driver(DriverSabotage::ResignWithoutHoldOff),
        Self::FenceWithoutRowLock,
    ];

    /// The CLI name (`--sabotage NAME`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Driver(DriverSabotage::NeverPing) => "never-ping",
            Self::Driver(DriverSabotage::ReturnGrantedToPool) => "return-granted-to-pool",
            Self::Driver(DriverSabotage::SkipIdleSessionTimeout) => "skip-idle-session-timeout",
            Self::Driver(DriverSabotage::KeepTermOnFailedPing) => "keep-term-on-failed-ping",
            Self::Driver(DriverSabotage::ResignWithoutHoldOff) => "resign-without-hold-off",
            Self::FenceWithoutRowLock => "fence-without-row-lock",
        }
    }

    /// The sabotage named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|sabotage| sabotage.name() == name)
    }

    /// The adapter's driver sabotage, if this is one.
    pub(crate) fn driver(self) -> Option<DriverSabotage> {
        match self {
            Self::Driver(driver) => Some(driver),
            Self::FenceWithoutRowLock => None,
        }
    }
}

impl fmt::Display for Sabotage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips() {
        for sabotage in Sabotage::ALL {
            assert_eq!(Sabotage::from_name(sabotage.name()), Some(sabotage));
        }
        assert_eq!(Sabotage::from_name("nope"), None);
    }
}
