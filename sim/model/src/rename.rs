//! What the symmetry reduction asks of every part of the environment that names replicas by
//! index (the modes' lock tables and histories): a fingerprint free of the indices, and a
//! renaming of them. It sits below the engine and the server so that both can name it.

use std::hash::DefaultHasher;

/// A part of the environment that names replicas by index: the mode's lock table and history.
pub trait Renamed {
    /// Hashes what in it is the replica's for which `mine` holds, free of replica indices.
    fn fingerprint(&self, mine: &dyn Fn(u8) -> bool, hasher: &mut DefaultHasher);
    /// Renames every replica index in it by `rename`.
    fn rename(&mut self, rename: &dyn Fn(u8) -> u8);
}
