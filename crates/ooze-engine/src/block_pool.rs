//! The KV memory's blocks and who holds them: a reference count per block (each sequence whose
//! block table lists it holds one reference, the prefix tree one more while it keeps the block),
//! the free list, and how many blocks only the prefix tree holds (cached: evictable on demand).
//!
//! A block goes back to the free list when its last reference is released, so memory cannot
//! leak while references are released in pairs with the ones taken. [`BlockPool::check`] verifies
//! the bookkeeping itself (the seeded tests call it after every operation).

pub struct BlockPool {
    refs: Vec<u32>,
    /// Whether the prefix tree holds a reference to the block.
    held: Vec<bool>,
    /// Free blocks, lowest last (so the lowest is handed out first).
    free: Vec<i64>,
    /// Blocks whose only reference is the prefix tree's.
    cached: usize,
}

impl BlockPool {
    pub fn new(blocks: i64) -> BlockPool {
        let n = blocks.max(0) as usize;
        BlockPool {
            refs: vec![0; n],
            held: vec![false; n],
            free: (0..blocks.max(0)).rev().collect(),
            cached: 0,
        }
    }

    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks nobody holds.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Blocks only the prefix tree holds: they can be evicted to make room.
    pub fn cached(&self) -> usize {
        self.cached
    }

    /// Blocks a sequence can get: free ones, and cached ones once evicted.
    pub fn available(&self) -> usize {
        self.free.len() + self.cached
    }

    pub fn refs(&self, block: i64) -> u32 {
        self.refs[block as usize]
    }

    /// A free block, held once by the caller; `None` when none is free (evict first).
    pub fn allocate(&mut self) -> Option<i64> {
        let block = self.free.pop()?;
        self.refs[block as usize] = 1;
        Some(block)
    }

    /// One more reference to a block someone already holds.
    pub fn share(&mut self, block: i64) {
        let b = block as usize;
        assert!(self.refs[b] > 0, "invariant: only held blocks are shared");
        if self.held[b] && self.refs[b] == 1 {
            self.cached -= 1;
        }
        self.refs[b] += 1;
    }

    /// Gives one reference back; the block is free when it was the last.
    pub fn release(&mut self, block: i64) {
        let b = block as usize;
        assert!(self.refs[b] > 0, "invariant: only held blocks are released");
        self.refs[b] -= 1;
        match self.refs[b] {
            0 => {
                assert!(
                    !self.held[b],
                    "invariant: the tree's reference is released with drop_held"
                );
                self.free.push(block);
            }
            1 if self.held[b] => self.cached += 1,
            _ => {}
        }
    }

    /// The prefix tree takes a reference to a block a sequence holds.
    pub fn hold(&mut self, block: i64) {
        let b = block as usize;
        assert!(!self.held[b], "invariant: the tree holds a block once");
        self.share(block);
        self.held[b] = true;
    }

    /// The prefix tree gives its reference back.
    pub fn drop_held(&mut self, block: i64) {
        let b = block as usize;
        assert!(
            self.held[b],
            "invariant: only held blocks are dropped by the tree"
        );
        if self.refs[b] == 1 {
            self.cached -= 1;
        }
        self.held[b] = false;
        self.release(block);
    }

    /// The prefix tree hands its reference to a sequence (a kept sequence continued in place).
    pub fn transfer_held(&mut self, block: i64) {
        let b = block as usize;
        assert!(self.held[b], "invariant: only held blocks are transferred");
        if self.refs[b] == 1 {
            self.cached -= 1;
        }
        self.held[b] = false;
    }

    /// Checks the bookkeeping: free blocks are unreferenced and listed once, referenced ones are
    /// not free, the cached count matches, and every block's references are those `holders`
    /// (each sequence's block table) and the tree account for.
    pub fn check<'a>(&self, holders: impl IntoIterator<Item = &'a [i64]>) -> Result<(), String> {
        let mut expected: Vec<u32> = self.held.iter().map(|&h| u32::from(h)).collect();
        for table in holders {
            for &block in table {
                let slot = expected
                    .get_mut(block as usize)
                    .ok_or_else(|| format!("block {block} is out of range"))?;
                *slot += 1;
            }
        }
        if expected != self.refs {
            let first = (0..self.refs.len())
                .find(|&b| expected[b] != self.refs[b])
                .unwrap_or(0);
            return Err(format!(
                "block {first} has {} references, its holders account for {}",
                self.refs[first], expected[first]
            ));
        }
        let mut listed = vec![false; self.refs.len()];
        for &block in &self.free {
            let b = block as usize;
            if listed[b] {
                return Err(format!("block {block} is listed free twice"));
            }
            listed[b] = true;
            if self.refs[b] != 0 {
                return Err(format!(
                    "free block {block} has {} references",
                    self.refs[b]
                ));
            }
        }
        let unreferenced = self.refs.iter().filter(|&&r| r == 0).count();
        if unreferenced != self.free.len() {
            return Err(format!(
                "{unreferenced} blocks are unreferenced but {} are free (a leak)",
                self.free.len()
            ));
        }
        let cached = (0..self.refs.len())
            .filter(|&b| self.held[b] && self.refs[b] == 1)
            .count();
        if cached != self.cached {
            return Err(format!(
                "{cached} blocks are cached, counted {}",
                self.cached
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_free_and_cache_blocks() {
        let mut pool = BlockPool::new(3);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_eq!((a, b, pool.free()), (0, 1, 1), "lowest first");
        pool.hold(a);
        assert_eq!(pool.cached(), 0, "the sequence still holds it");
        pool.release(a);
        assert_eq!((pool.cached(), pool.available()), (1, 2));
        pool.share(a);
        assert_eq!(pool.cached(), 0);
        pool.check([&[a][..], &[b][..]]).unwrap();
        assert!(
            pool.check([&[b][..]]).is_err(),
            "a reference nobody accounts for"
        );
        pool.release(a);
        pool.drop_held(a);
        pool.release(b);
        assert_eq!((pool.free(), pool.cached()), (3, 0));
        pool.check([]).unwrap();
    }
}
