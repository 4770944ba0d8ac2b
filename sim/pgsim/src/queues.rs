//! First-come, first-served queues of waiting sessions, one per lockable object: what the
//! advisory lock table ([`LockTable`](super::locks::LockTable)) and the row locks
//! ([`RowLocks`](super::rows::RowLocks)) share. Pure data.

use std::collections::{BTreeMap, VecDeque};

/// The sessions waiting for each object `K`, oldest first; a key is present only while its
/// queue is not empty.
#[derive(Debug)]
pub(crate) struct WaitQueues<K> {
    queues: BTreeMap<K, VecDeque<i32>>,
}

impl<K> Default for WaitQueues<K> {
    fn default() -> Self {
        Self {
            queues: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> WaitQueues<K> {
    /// Queues `pid` behind the object's current waiters.
    pub(crate) fn enqueue(&mut self, key: K, pid: i32) {
        self.queues.entry(key).or_default().push_back(pid);
    }

    /// Takes `pid` out of the queue of `key`; false when it was not waiting there.
    pub(crate) fn cancel(&mut self, key: &K, pid: i32) -> bool {
        let Some(queue) = self.queues.get_mut(key) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|&waiter| waiter != pid);
        let removed = queue.len() != before;
        if queue.is_empty() {
            self.queues.remove(key);
        }
        removed
    }

    /// Takes `pid` out of every queue (its session ended).
    pub(crate) fn cancel_everywhere(&mut self, pid: i32) {
        self.queues.retain(|_, queue| {
            queue.retain(|&waiter| waiter != pid);
            !queue.is_empty()
        });
    }

    /// Takes the first waiter of `key` out of its queue.
    pub(crate) fn pop_front(&mut self, key: &K) -> Option<i32> {
        let queue = self.queues.get_mut(key)?;
        let pid = queue.pop_front();
        if queue.is_empty() {
            self.queues.remove(key);
        }
        pid
    }

    /// Takes out of their queues the waiters `may_go` accepts, and returns them in key order
    /// and queue order.
    pub(crate) fn take_where(&mut self, mut may_go: impl FnMut(&K, i32) -> bool) -> Vec<(K, i32)> {
        let mut taken = Vec::new();
        self.queues.retain(|key, queue| {
            queue.retain(|&waiter| {
                let go = may_go(key, waiter);
                if go {
                    taken.push((key.clone(), waiter));
                }
                !go
            });
            !queue.is_empty()
        });
        taken
    }

    /// Whether some session waits for `key`.
    pub(crate) fn is_waited(&self, key: &K) -> bool {
        self.queues.contains_key(key)
    }

    /// Every waiter, as `(key, pid)` in key order and queue order.
    pub(crate) fn all(&self) -> Vec<(K, i32)> {
        self.queues
            .iter()
            .flat_map(|(key, queue)| queue.iter().map(move |&pid| (key.clone(), pid)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_leave_in_queue_order_and_empty_queues_disappear() {
        let mut queues = WaitQueues::default();
        queues.enqueue('a', 1);
        queues.enqueue('b', 2);
        queues.enqueue('a', 3);
        assert_eq!(queues.all(), vec![('a', 1), ('a', 3), ('b', 2)]);
        assert_eq!(queues.pop_front(&'a'), Some(1));
        assert!(queues.cancel(&'a', 3));
        assert!(!queues.cancel(&'a', 3));
        assert_eq!(queues.pop_front(&'a'), None);
        queues.enqueue('c', 2);
        queues.cancel_everywhere(2);
        assert_eq!(queues.all(), vec![]);
        assert!(queues.queues.is_empty());
    }

    #[test]
    fn take_where_takes_only_the_accepted_waiters() {
        let mut queues = WaitQueues::default();
        for (key, pid) in [('a', 1), ('a', 2), ('b', 3)] {
            queues.enqueue(key, pid);
        }
        assert_eq!(
            queues.take_where(|_, pid| pid != 2),
            vec![('a', 1), ('b', 3)]
        );
        assert_eq!(queues.all(), vec![('a', 2)]);
    }
}
