//! The version floor ([`Config::version_floor`](crate::Config::version_floor)): per election
//! key, the newest version that has led, kept in the table `plexsphere_leader_floor`. Every
//! ranked leader raises it to its version in its survey after each check; a replica older than
//! it makes no attempt (WARN once, naming both versions), and a leader found below it (granted
//! on an attempt begun before a newer leader raised it) yields at its next check. A deliberate
//! rollback runs the older replicas with
//! [`Config::below_version_floor`](crate::Config::below_version_floor): they lead, and their
//! leader sets the floor to its own version.
//!
//! The lease mechanism's setup ([`lease::setup`](crate::lease::setup)) creates the table in the
//! lease's schema. With the advisory lock run [`setup`] (or [`setup_statement`] with another
//! backend; with sqlx, `plexsphere_leader_sqlx::floor::setup`) in each database, from a
//! migration or at start-up by every replica; the table is then named unqualified, as the fence
//! table is. Without it a ranked standby's survey fails (42P01, logged at WARN with the
//! server's error) and it never leads.

pub use crate::sql::candidacy::FLOOR_TABLE;

/// The idempotent statement [`setup`] runs: quiet (no NOTICE when the table exists) and
/// serialized as every setup is (one transaction-level advisory lock first), for backends of
/// their own and migrations.
pub fn setup_statement() -> String {
    crate::sql::lease::serialized_setup(&crate::sql::candidacy::floor_setup(FLOOR_TABLE))
}

/// Creates the floor table of the advisory lock in the connection's database (idempotent), on
/// what you hold ([`FenceClient`](crate::fencing::FenceClient)). Safe to run from every
/// replica at the same start: every setup takes one transaction-level advisory lock first.
///
/// # Errors
/// [`FenceError::Setup`](crate::fencing::FenceError::Setup) naming `floor::setup`, with the
/// server's error (for example a missing `CREATE` privilege).
#[cfg(feature = "deadpool")]
pub async fn setup(
    client: &impl crate::fencing::FenceClient,
) -> Result<(), crate::fencing::FenceError> {
    crate::fencing::run_setup(client, "floor::setup", &setup_statement()).await
}
