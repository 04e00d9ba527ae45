//! Which KV blocks each sequence uses: the [`BlockPool`] and the [`PrefixTree`] together. A new
//! sequence claims what the tree already holds of its tokens ([`KvBlocks::claim`]), grows its
//! block table as it gets longer ([`KvBlocks::grow`], evicting cached blocks when none is free),
//! and when it ends gives its blocks to the tree for later requests ([`KvBlocks::release`]).

use crate::block_pool::BlockPool;
use crate::prefix_tree::{PrefixTree, Tail};

pub struct KvBlocks {
    pool: BlockPool,
    tree: PrefixTree,
    block_size: usize,
    /// Counts flushes: a sequence that started before the last one holds keys/values of old
    /// weights, which must not go into the tree.
    epoch: u64,
}

/// A block whose first `len` positions a new sequence gets as a copy of another block's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    pub from: i64,
    pub to: i64,
    pub len: i64,
}

/// What a new sequence starts with: its block table so far and how many of its tokens' keys and
/// values are already there (after `copy`, when there is one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub table: Vec<i64>,
    pub reused: usize,
    pub copy: Option<BlockCopy>,
}

/// How a new sequence would start ([`KvBlocks::plan`]): whole shared blocks, then part of one
/// more block. Valid until the prefix tree next changes: claim it at once.
pub struct Plan {
    shared: Vec<usize>,
    tail: Option<(Tail, usize)>,
    reused: usize,
}

impl Plan {
    /// Tokens whose keys/values the sequence would find kept.
    pub fn reused(&self) -> usize {
        self.reused
    }
}

impl KvBlocks {
    pub fn new(blocks: i64, block_size: i64) -> KvBlocks {
        KvBlocks {
            pool: BlockPool::new(blocks),
            tree: PrefixTree::new(block_size as usize),
            block_size: block_size as usize,
            epoch: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total(&self) -> usize {
        self.pool.total()
    }

    /// Blocks a sequence can get: free ones and cached ones (evicted when needed).
    pub fn available(&self) -> usize {
        self.pool.available()
    }

    /// Blocks only the prefix tree holds.
    pub fn cached(&self) -> usize {
        self.pool.cached()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Blocks that hold `len` positions.
    fn blocks_for(&self, len: usize) -> usize {
        len.div_ceil(self.block_size)
    }

    /// What the tree holds of `tokens` that a new sequence can start from, at most `usable`
    /// tokens: the whole blocks it shares, and for part of a further block either a kept partial
    /// block nobody else uses (taken over) or a part copied into a new block. Reuse shorter than
    /// `min_reuse` tokens is not worth it: nothing is reused then.
    pub fn plan(&self, tokens: &[u32], usable: usize, min_reuse: usize) -> Plan {
        let bs = self.block_size;
        let found = self.tree.find(tokens);
        let whole = found.path.len().min(usable / bs);
        let left = usable - whole * bs;
        let tail = if whole < found.path.len() {
            // The path goes on, but only part of its next block is usable.
            let len = left.min(bs);
            let node = found.path[whole];
            Some((
                Tail {
                    node,
                    len,
                    partial: false,
                },
                len,
            ))
        } else {
            found.tail.map(|t| (t, t.len.min(left)))
        }
        .filter(|&(_, len)| len > 0);
        let reused = whole * bs + tail.map_or(0, |(_, len)| len);
        if reused < min_reuse {
            return Plan {
                shared: Vec::new(),
                tail: None,
                reused: 0,
            };
        }
        Plan {
            shared: found.path[..whole].to_vec(),
            tail,
            reused,
        }
    }

    /// How far [`KvBlocks::available`] drops when a sequence of `len` positions starts as `plan`
    /// says (claim, then grow): by every block of its table, except shared ones that another
    /// sequence uses already (a shared or taken block only the tree held was counted available).
    pub fn needed(&self, plan: &Plan, len: usize) -> usize {
        let in_use = plan
            .shared
            .iter()
            .filter(|&&n| self.pool.refs(self.tree.block(n)) > 1)
            .count();
        self.blocks_for(len).saturating_sub(in_use)
    }

    /// Starts a sequence as `plan` says: its shared blocks referenced, a kept tail taken over or a
    /// new block for the copied part (when one can be had; otherwise that part is not reused).
    pub fn claim(&mut self, plan: Plan) -> Claim {
        self.tree.touch(&plan.shared);
        let mut table: Vec<i64> = plan.shared.iter().map(|&n| self.tree.block(n)).collect();
        for &block in &table {
            self.pool.share(block);
        }
        let mut reused = table.len() * self.block_size;
        let mut copy = None;
        if let Some((tail, len)) = plan.tail {
            if tail.partial {
                table.push(self.tree.take(&mut self.pool, tail.node));
                reused += len;
            } else {
                // The source stays shared while the copy is made: it cannot be evicted for it.
                let from = self.tree.block(tail.node);
                self.pool.share(from);
                if let Some(to) = self.allocate() {
                    table.push(to);
                    reused += len;
                    copy = Some(BlockCopy {
                        from,
                        to,
                        len: len as i64,
                    });
                }
                self.pool.release(from);
            }
        }
        Claim {
            table,
            reused,
            copy,
        }
    }

    /// A free block, evicting the least recently used cached one when none is free.
    fn allocate(&mut self) -> Option<i64> {
        loop {
            if let Some(block) = self.pool.allocate() {
                return Some(block);
            }
            if !self.tree.evict(&mut self.pool) {
                return None;
            }
        }
    }

    /// Extends `table` to hold `len` positions; false (with the table as far as it got) when
    /// blocks run out.
    pub fn grow(&mut self, table: &mut Vec<i64>, len: usize) -> bool {
        while table.len() < self.blocks_for(len) {
            match self.allocate() {
                Some(block) => table.push(block),
                None => return false,
            }
        }
        true
    }

    /// Offers the whole blocks of a running sequence's `tokens` to the tree (after its prefill, so
    /// that the other samples of its prompt share them).
    pub fn publish(&mut self, tokens: &[u32], table: &[i64], epoch: u64) {
        if epoch == self.epoch {
            self.tree.insert(&mut self.pool, tokens, table, true);
        }
    }

    /// Ends a sequence whose blocks hold the keys/values of `tokens`: the tree keeps them (unless
    /// they are from before the last flush), and the sequence's references go.
    pub fn release(&mut self, table: Vec<i64>, tokens: &[u32], epoch: u64) {
        if epoch == self.epoch {
            self.tree.insert(&mut self.pool, tokens, &table, false);
        }
        for block in table {
            self.pool.release(block);
        }
    }

    /// Forgets every kept prefix; running sequences keep their blocks until they end.
    pub fn flush(&mut self) {
        self.tree.clear(&mut self.pool);
        self.epoch += 1;
    }

    /// Checks the pool against `tables` (every running sequence's) and the tree's structure.
    pub fn check<'a>(&self, tables: impl IntoIterator<Item = &'a [i64]>) -> Result<(), String> {
        self.pool.check(tables)?;
        self.tree.check(&self.pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Seeded xorshift: the same operations on every run.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n.max(1) as u64) as usize
        }
    }

    /// A sequence of the fake engine: its tokens, how many have keys/values in its blocks.
    struct Seq {
        tokens: Vec<u32>,
        cached: usize,
        table: Vec<i64>,
        epoch: u64,
    }

    /// Fake KV memory: which token each position of each block holds.
    struct Memory {
        block_size: usize,
        cells: HashMap<i64, Vec<Option<u32>>>,
    }

    impl Memory {
        fn at(&self, table: &[i64], p: usize) -> Option<u32> {
            let bs = self.block_size;
            self.cells.get(&table[p / bs]).and_then(|b| b[p % bs])
        }
        fn write(&mut self, kv: &KvBlocks, table: &[i64], p: usize, token: u32) {
            let bs = self.block_size;
            let block = table[p / bs];
            assert_eq!(
                kv.pool.refs(block),
                1,
                "position {p} written into a shared block"
            );
            self.cells.entry(block).or_insert_with(|| vec![None; bs])[p % bs] = Some(token);
        }
        fn copy(&mut self, c: BlockCopy) {
            let src = self.cells[&c.from].clone();
            let dst = self
                .cells
                .entry(c.to)
                .or_insert_with(|| vec![None; self.block_size]);
            dst[..c.len as usize].copy_from_slice(&src[..c.len as usize]);
        }
    }

    fn tables(running: &[Seq]) -> Vec<&[i64]> {
        running.iter().map(|s| &s.table[..]).collect()
    }

    /// Random starts (often sharing prefixes), growth, publishing, preemption, ends and flushes
    /// against a fake memory: after every operation the bookkeeping checks out, and every reused
    /// position holds exactly the token the sequence has there.
    fn run(seed: u64, blocks: i64, block_size: i64, steps: usize) -> usize {
        let mut rng = Rng(seed);
        let mut kv = KvBlocks::new(blocks, block_size);
        let bs = block_size as usize;
        let mut mem = Memory {
            block_size: bs,
            cells: HashMap::new(),
        };
        let mut running: Vec<Seq> = Vec::new();
        let mut history: Vec<Vec<u32>> = vec![vec![1, 2, 3, 4, 5, 6, 7, 8, 9]];
        let (mut reused_total, mut preempted) = (0, 0);
        for step in 0..steps {
            match rng.below(10) {
                0..=3 if running.len() < 12 => {
                    // Start: a prefix of an earlier sequence plus new tokens, over a small vocabulary.
                    let base = &history[rng.below(history.len())];
                    let mut tokens = base[..rng.below(base.len() + 1)].to_vec();
                    for _ in 0..1 + rng.below(3 * bs) {
                        tokens.push(rng.below(3) as u32);
                    }
                    let usable = tokens.len() - 1 - rng.below(2).min(tokens.len() - 1);
                    let plan = kv.plan(&tokens, usable, 2);
                    let need = kv.needed(&plan, tokens.len() + 1);
                    if need > kv.available() {
                        continue;
                    }
                    let expect = plan.reused();
                    let claim = kv.claim(plan);
                    assert!(claim.reused <= usable && claim.reused <= expect);
                    if let Some(c) = claim.copy {
                        mem.copy(c);
                    }
                    let mut table = claim.table;
                    for (p, &token) in tokens.iter().enumerate().take(claim.reused) {
                        assert_eq!(mem.at(&table, p), Some(token), "step {step}: position {p}");
                    }
                    reused_total += claim.reused;
                    let avail = kv.available();
                    assert!(
                        kv.grow(&mut table, tokens.len() + 1),
                        "seed {seed} step {step}: checked room: needed {need}, available {avail}, table {table:?}, tokens {}, reused {}, copy {:?}, bs {bs}",
                        tokens.len(), claim.reused, claim.copy
                    );
                    for (p, &t) in tokens.iter().enumerate().skip(claim.reused) {
                        mem.write(&kv, &table, p, t);
                    }
                    let seq = Seq {
                        cached: tokens.len(),
                        tokens,
                        table,
                        epoch: kv.epoch(),
                    };
                    if rng.below(2) == 0 {
                        kv.publish(&seq.tokens, &seq.table, seq.epoch);
                    }
                    running.push(seq);
                }
                4..=6 if !running.is_empty() => {
                    // Decode a few tokens; preempt the newest sequence when blocks run out.
                    let i = rng.below(running.len());
                    for _ in 0..1 + rng.below(bs + 2) {
                        let s = &mut running[i];
                        let token = rng.below(3) as u32;
                        if !kv.grow(&mut s.table, s.cached + 1) {
                            let s = running.pop().expect("non-empty");
                            kv.release(s.table, &s.tokens[..s.cached], s.epoch);
                            preempted += 1;
                            break;
                        }
                        let p = s.cached;
                        s.tokens.push(token);
                        s.cached += 1;
                        let table = s.table.clone();
                        mem.write(&kv, &table, p, token);
                    }
                }
                7 | 8 if !running.is_empty() => {
                    let s = running.swap_remove(rng.below(running.len()));
                    // An aborted sequence may hold a table longer than its keys/values.
                    history.push(s.tokens.clone());
                    kv.release(s.table, &s.tokens[..s.cached], s.epoch);
                }
                9 if rng.below(8) == 0 => kv.flush(),
                _ => {}
            }
            kv.check(tables(&running))
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
        }
        assert!(reused_total > 0, "seed {seed}: prefixes were shared");
        for s in running.drain(..) {
            kv.release(s.table, &s.tokens[..s.cached], s.epoch);
        }
        kv.check(std::iter::empty()).unwrap();
        kv.flush();
        kv.check(std::iter::empty()).unwrap();
        assert_eq!(kv.pool.free(), kv.total(), "seed {seed}: no block leaked");
        preempted
    }

    #[test]
    fn random_operations_keep_the_books_and_share_only_matching_tokens() {
        for seed in 1..=40u64 {
            let block_size = [1, 2, 4, 16][seed as usize % 4];
            run(seed * 7919, 48, block_size, 600);
        }
    }

    #[test]
    fn tight_memory_evicts_and_preempts_without_leaks() {
        let preempted: usize = (1..=20u64)
            .map(|seed| run(seed * 104_729, 12, 4, 800))
            .sum();
        assert!(preempted > 0, "growth ran out of blocks and preempted");
    }

    #[test]
    fn samples_of_a_prompt_share_its_whole_blocks_and_a_turn_takes_its_tail() {
        let mut kv = KvBlocks::new(16, 4);
        let prompt: Vec<u32> = (0..10).collect();
        let first = kv.claim(kv.plan(&prompt, 9, 4));
        assert_eq!((first.reused, first.table.len()), (0, 0));
        let mut table = first.table;
        assert!(kv.grow(&mut table, 11));
        kv.publish(&prompt, &table, 0);
        // Another sample: the two whole blocks are shared, the last two tokens recomputed.
        let second = kv.claim(kv.plan(&prompt, 9, 4));
        assert_eq!(second.table, table[..2].to_vec());
        assert_eq!(second.reused, 8);
        kv.release(second.table, &[], 0);
        // The first sample ends after 3 output tokens: its tail (13 = 3·4 + 1) is kept.
        let mut turn: Vec<u32> = prompt.clone();
        turn.extend([100, 101, 102]);
        assert!(kv.grow(&mut table, turn.len() + 1));
        kv.release(table.clone(), &turn, 0);
        assert_eq!(kv.cached(), 4, "three whole blocks and the partial one");
        // The next turn goes on from it: the tail block is taken over in place.
        turn.extend([7, 7, 7]);
        let next = kv.claim(kv.plan(&turn, turn.len() - 1, 4));
        assert_eq!(next.reused, 13);
        assert_eq!(next.table, table[..4].to_vec());
        assert_eq!(next.copy, None);
        kv.check([&next.table[..]]).unwrap();
        // A request that needs only part of a shared whole block copies it (at least 4 tokens).
        let part: Vec<u32> = (0..7).collect();
        let copy = kv.claim(kv.plan(&part, 6, 2));
        assert_eq!(copy.reused, 6);
        assert_eq!(copy.table[0], table[0]);
        assert_eq!(
            copy.copy,
            Some(BlockCopy {
                from: table[1],
                to: copy.table[1],
                len: 2
            })
        );
        kv.check([&next.table[..], &copy.table[..]]).unwrap();
    }
}
