//! Keys/values of finished sequences kept in their slots until the slot is needed: a request whose
//! input starts with a kept sequence (the next turn of a multi-turn agent, another sample of the
//! same prompt) starts after the common prefix instead of recomputing it.
//!
//! Content-addressed by token ids, so no session bookkeeping is needed for correctness. Eviction is
//! least-recently-used. A weight update empties it (the kept keys/values were computed by old
//! weights).

/// A kept sequence: its slot and the token ids whose keys/values the slot holds.
struct Entry {
    slot: i64,
    tokens: Vec<u32>,
    last_used: u64,
}

#[derive(Default)]
pub struct PrefixCache {
    entries: Vec<Entry>,
    clock: u64,
}

/// Length of the common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keeps `slot` holding `tokens`.
    pub fn retain(&mut self, slot: i64, tokens: Vec<u32>) {
        self.clock += 1;
        self.entries.push(Entry {
            slot,
            tokens,
            last_used: self.clock,
        });
    }

    /// The kept sequence sharing the longest prefix with `prompt`: (slot, length).
    pub fn best_match(&self, prompt: &[u32]) -> Option<(i64, usize)> {
        self.entries
            .iter()
            .map(|e| (e.slot, common_prefix(&e.tokens, prompt)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n)
    }

    /// Stops keeping `slot` (it is being reused in place); returns whether it was kept.
    pub fn take(&mut self, slot: i64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.slot != slot);
        before != self.entries.len()
    }

    /// Frees the least recently used slot, other than `keep`.
    pub fn evict(&mut self, keep: Option<i64>) -> Option<i64> {
        let (i, _) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| Some(e.slot) != keep)
            .min_by_key(|(_, e)| e.last_used)?;
        Some(self.entries.swap_remove(i).slot)
    }

    /// Frees every kept slot.
    pub fn clear(&mut self) -> Vec<i64> {
        self.entries.drain(..).map(|e| e.slot).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_match_and_lru_eviction() {
        let mut cache = PrefixCache::default();
        cache.retain(3, vec![1, 2, 3, 4]);
        cache.retain(5, vec![1, 2, 9]);
        cache.retain(7, vec![8]);
        assert_eq!(cache.best_match(&[1, 2, 3, 4, 5]), Some((3, 4)));
        assert_eq!(cache.best_match(&[1, 2, 9, 9]), Some((5, 3)));
        assert_eq!(cache.best_match(&[6]), None);
        assert_eq!(
            cache.evict(Some(3)),
            Some(5),
            "oldest other than the one kept"
        );
        assert_eq!(cache.evict(None), Some(3));
        assert!(cache.take(7));
        assert!(!cache.take(7));
        assert!(cache.is_empty());
        cache.retain(1, vec![1]);
        assert_eq!(cache.clear(), vec![1]);
    }
}
