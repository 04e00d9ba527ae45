//! Token prefixes whose keys/values are kept in KV blocks: a radix tree whose edges are whole
//! blocks of tokens. A request that starts like a kept sequence — another sample of the same
//! prompt, the next turn of an agent, a later session with the same system prompt — shares the
//! kept blocks instead of recomputing them.
//!
//! - An inner node is one full block: its `block_size` tokens key it among its parent's children.
//! - A partial leaf holds the last, partly filled block of a finished sequence (fewer tokens). A
//!   request that goes on from it copies the block, or takes it over when nobody else uses it.
//! - Content-addressed by token ids, so no session bookkeeping is needed for correctness. A node's
//!   children are indexed by their whole tokens (the walk down whole blocks) and by their first
//!   token (the candidates for a partial match), so a lookup never scans all of a node's children
//!   (the root's may be thousands: one per distinct prompt start).
//! - Leaves are evicted least recently used first, and only when no sequence holds their block
//!   (the [`BlockPool`]'s reference counts say). Inner nodes become leaves as their children go.
//!
//! The tree holds one reference to each of its blocks ([`BlockPool::hold`]); it never allocates.

use crate::block_pool::BlockPool;
use std::collections::{BTreeSet, HashMap};

const ROOT: usize = 0;

struct Node {
    parent: usize,
    /// The tokens whose keys/values `block` holds.
    tokens: Vec<u32>,
    block: i64,
    /// Full-block children by their tokens.
    full: HashMap<Vec<u32>, usize>,
    /// Every child (full or partial) by its first token: the candidates for a partial match.
    by_first: HashMap<u32, Vec<usize>>,
    last_used: u64,
}

impl Node {
    fn new(parent: usize, tokens: Vec<u32>, block: i64) -> Node {
        Node {
            parent,
            tokens,
            block,
            full: HashMap::new(),
            by_first: HashMap::new(),
            last_used: 0,
        }
    }

    fn is_leaf(&self) -> bool {
        self.by_first.is_empty()
    }

    /// The children whose first token is `first`.
    fn starting_with(&self, first: Option<&u32>) -> &[usize] {
        first
            .and_then(|t| self.by_first.get(t))
            .map_or(&[], |v| &v[..])
    }
}

pub struct PrefixTree {
    block_size: usize,
    nodes: Vec<Option<Node>>,
    spare: Vec<usize>,
    /// Every node without children (the root aside), by last use.
    leaves: BTreeSet<(u64, usize)>,
    clock: u64,
}

/// What the tree holds of a token sequence: whole blocks along `path`, then possibly part of one
/// more block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub path: Vec<usize>,
    pub tail: Option<Tail>,
}

/// A block whose first `len` tokens (fewer than it holds, or a partial leaf) continue the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    pub node: usize,
    pub len: usize,
    /// A partial leaf (which a request may take over) rather than a full block.
    pub partial: bool,
}

/// Length of the common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixTree {
    pub fn new(block_size: usize) -> PrefixTree {
        let root = Node::new(ROOT, Vec::new(), -1);
        PrefixTree {
            block_size,
            nodes: vec![Some(root)],
            spare: Vec::new(),
            leaves: BTreeSet::new(),
            clock: 0,
        }
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id]
            .as_ref()
            .expect("invariant: node ids in use are live")
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        self.nodes[id]
            .as_mut()
            .expect("invariant: node ids in use are live")
    }

    /// Nodes kept (the root not counted).
    pub fn len(&self) -> usize {
        self.nodes.len() - self.spare.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn block(&self, node: usize) -> i64 {
        self.node(node).block
    }

    /// How much of `tokens` the tree holds.
    pub fn find(&self, tokens: &[u32]) -> Found {
        let bs = self.block_size;
        let (mut cur, mut at, mut path) = (ROOT, 0, Vec::new());
        while at + bs <= tokens.len() {
            match self.node(cur).full.get(&tokens[at..at + bs]) {
                Some(&child) => {
                    path.push(child);
                    cur = child;
                    at += bs;
                }
                None => break,
            }
        }
        let rest = &tokens[at..];
        let tail = self
            .node(cur)
            .starting_with(rest.first())
            .iter()
            .map(|&c| {
                let child = &self.node(c).tokens;
                Tail {
                    node: c,
                    len: common_prefix(child, rest),
                    partial: child.len() < bs,
                }
            })
            .max_by_key(|t| (t.len, t.partial));
        Found { path, tail }
    }

    /// Marks nodes as just used (eviction takes the least recently used leaves first).
    pub fn touch(&mut self, nodes: &[usize]) {
        for &id in nodes {
            self.clock += 1;
            let clock = self.clock;
            let node = self.node_mut(id);
            let before = node.last_used;
            node.last_used = clock;
            if self.leaves.remove(&(before, id)) {
                self.leaves.insert((clock, id));
            }
        }
    }

    /// Keeps the keys/values of `tokens`, held in `table`'s blocks (block `i` holds tokens
    /// `[i·bs, (i+1)·bs)`): each whole block the tree lacks becomes a node holding it. Blocks of
    /// prefixes the tree already has stay with the caller.
    ///
    /// `running`: the caller goes on using the blocks. Then the last partly filled block is not
    /// kept, and nothing is added below a node whose block is not the caller's: every node a
    /// running sequence holds has its ancestors held by it too, so a node only the tree holds has
    /// no held descendants and can be evicted once its children are. Otherwise (the sequence
    /// ends) its partly filled last block becomes a partial leaf.
    pub fn insert(&mut self, pool: &mut BlockPool, tokens: &[u32], table: &[i64], running: bool) {
        let bs = self.block_size;
        let whole = (tokens.len() / bs).min(table.len());
        let mut cur = ROOT;
        for (i, &block) in table.iter().enumerate().take(whole) {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            cur = match self.node(cur).full.get(chunk) {
                Some(&child) if running && self.node(child).block != block => return,
                Some(&child) => child,
                None => self.add(pool, cur, chunk.to_vec(), block),
            };
            self.touch(&[cur]);
        }
        let rest = &tokens[whole * bs..];
        if running || rest.is_empty() || whole >= table.len() {
            return;
        }
        let candidates = self.node(cur).starting_with(rest.first()).to_vec();
        // Already kept (in a full block or a longer tail): nothing to add.
        if let Some(&kept) = candidates
            .iter()
            .find(|&&c| self.node(c).tokens.starts_with(rest))
        {
            self.touch(&[kept]);
            return;
        }
        // A kept tail that this one extends is superseded, unless someone uses it.
        for c in candidates {
            let node = self.node(c);
            if node.tokens.len() < bs
                && rest.starts_with(&node.tokens)
                && pool.refs(node.block) == 1
            {
                let block = self.remove(c);
                pool.drop_held(block);
            }
        }
        let leaf = self.add(pool, cur, rest.to_vec(), table[whole]);
        self.touch(&[leaf]);
    }

    /// Hands a partial leaf's block (and the tree's reference to it) to the caller, who goes on
    /// writing into it.
    pub fn take(&mut self, pool: &mut BlockPool, leaf: usize) -> i64 {
        let block = self.remove(leaf);
        pool.transfer_held(block);
        block
    }

    /// Frees the least recently used block only the tree holds; false when there is none.
    pub fn evict(&mut self, pool: &mut BlockPool) -> bool {
        let victim = self
            .leaves
            .iter()
            .find(|&&(_, id)| pool.refs(self.node(id).block) == 1)
            .map(|&(_, id)| id);
        match victim {
            Some(id) => {
                let block = self.remove(id);
                pool.drop_held(block);
                true
            }
            None => false,
        }
    }

    /// Forgets every node (their keys/values are stale after a weight update).
    pub fn clear(&mut self, pool: &mut BlockPool) {
        for node in self.nodes.drain(1..).flatten() {
            pool.drop_held(node.block);
        }
        let root = self.node_mut(ROOT);
        root.full.clear();
        root.by_first.clear();
        self.spare.clear();
        self.leaves.clear();
    }

    /// Links a new leaf below `parent`, the tree holding `block`.
    fn add(&mut self, pool: &mut BlockPool, parent: usize, tokens: Vec<u32>, block: i64) -> usize {
        pool.hold(block);
        let p = self.node(parent);
        if parent != ROOT && p.is_leaf() {
            self.leaves.remove(&(p.last_used, parent));
        }
        let (first, full) = (tokens[0], tokens.len() == self.block_size);
        let key = full.then(|| tokens.clone());
        let node = Node::new(parent, tokens, block);
        let id = match self.spare.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        let p = self.node_mut(parent);
        p.by_first.entry(first).or_default().push(id);
        if let Some(key) = key {
            p.full.insert(key, id);
        }
        self.leaves.insert((0, id));
        id
    }

    /// Unlinks a leaf; returns its block (the caller settles the tree's reference).
    fn remove(&mut self, id: usize) -> i64 {
        let node = self.nodes[id]
            .take()
            .expect("invariant: node ids in use are live");
        debug_assert!(node.is_leaf(), "only leaves are removed");
        self.leaves.remove(&(node.last_used, id));
        self.spare.push(id);
        let full = node.tokens.len() == self.block_size;
        let parent = self.node_mut(node.parent);
        if full {
            parent.full.remove(&node.tokens);
        }
        let first = node.tokens[0];
        if let Some(siblings) = parent.by_first.get_mut(&first) {
            siblings.retain(|&c| c != id);
            if siblings.is_empty() {
                parent.by_first.remove(&first);
            }
        }
        let parent = self.node(node.parent);
        if node.parent != ROOT && parent.is_leaf() {
            let key = (parent.last_used, node.parent);
            self.leaves.insert(key);
        }
        node.block
    }

    /// Checks the tree's structure against `pool`: links both ways, block sizes (full nodes hold a
    /// whole block, partial leaves less and have no children), every node's block held by the
    /// tree and by no other node, and the leaf index.
    pub fn check(&self, pool: &BlockPool) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        let mut leaves = BTreeSet::new();
        for (id, node) in self.nodes.iter().enumerate().skip(1) {
            let Some(node) = node else { continue };
            let parent = self.nodes[node.parent]
                .as_ref()
                .ok_or(format!("node {id}'s parent is gone"))?;
            if node.tokens.is_empty() {
                return Err(format!("node {id} holds no tokens"));
            }
            let full = node.tokens.len() == self.block_size;
            if !full && !node.is_leaf() {
                return Err(format!("partial node {id} has children"));
            }
            let linked = parent.starting_with(node.tokens.first()).contains(&id)
                && (!full || parent.full.get(&node.tokens) == Some(&id));
            if !linked {
                return Err(format!("node {id} is not linked from its parent"));
            }
            if node.tokens.len() > self.block_size {
                return Err(format!("node {id} holds more tokens than a block"));
            }
            if !seen.insert(node.block) {
                return Err(format!("block {} is in two nodes", node.block));
            }
            if pool.refs(node.block) == 0 {
                return Err(format!("node {id}'s block {} is free", node.block));
            }
            if node.is_leaf() {
                leaves.insert((node.last_used, id));
            }
        }
        if leaves != self.leaves {
            return Err("the leaf index does not match the leaves".into());
        }
        let indexed: usize = self
            .nodes
            .iter()
            .flatten()
            .map(|n| n.by_first.values().map(Vec::len).sum::<usize>())
            .sum();
        if indexed != self.len() {
            return Err(format!("{indexed} children indexed, {} nodes", self.len()));
        }
        Ok(())
    }
}
