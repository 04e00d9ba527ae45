//! Token prefixes whose keys/values are kept in KV blocks: a radix tree whose edges are whole
//! blocks of tokens. A request that starts like a kept sequence — another sample of the same
//! prompt, the next turn of an agent, a later session with the same system prompt — shares the
//! kept blocks instead of recomputing them.
//!
//! - An inner node is one full block: its `block_size` tokens key it among its parent's children.
//! - A partial leaf holds the last, partly filled block of a finished sequence (fewer tokens). A
//!   request that goes on from it copies the block, or takes it over when nobody else uses it.
//! - Content-addressed by token ids, so no session bookkeeping is needed for correctness.
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
    partial: Vec<usize>,
    last_used: u64,
}

impl Node {
    fn is_leaf(&self) -> bool {
        self.full.is_empty() && self.partial.is_empty()
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
        let root = Node {
            parent: ROOT,
            tokens: Vec::new(),
            block: -1,
            full: HashMap::new(),
            partial: Vec::new(),
            last_used: 0,
        };
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
        let node = self.node(cur);
        let fulls = node.full.values().map(|&c| (c, false));
        let partials = node.partial.iter().map(|&c| (c, true));
        let tail = fulls
            .chain(partials)
            .map(|(c, partial)| Tail {
                node: c,
                len: common_prefix(&self.node(c).tokens, rest),
                partial,
            })
            .filter(|t| t.len > 0)
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
                None => {
                    let child = self.add(pool, cur, chunk.to_vec(), block);
                    self.node_mut(cur).full.insert(chunk.to_vec(), child);
                    child
                }
            };
            self.touch(&[cur]);
        }
        let rest = &tokens[whole * bs..];
        if running || rest.is_empty() || whole >= table.len() {
            return;
        }
        let node = self.node(cur);
        let covered = node
            .full
            .keys()
            .any(|k| k.starts_with(rest))
            .then_some(None)
            .or_else(|| {
                node.partial
                    .iter()
                    .find(|&&c| self.node(c).tokens.starts_with(rest))
                    .map(|&c| Some(c))
            });
        match covered {
            // Already kept, in a full block: nothing to add.
            Some(None) => {}
            Some(Some(leaf)) => self.touch(&[leaf]),
            None => {
                // A kept tail that this one extends is superseded, unless someone uses it.
                let shorter: Vec<usize> = node
                    .partial
                    .iter()
                    .copied()
                    .filter(|&c| {
                        rest.starts_with(&self.node(c).tokens) && pool.refs(self.node(c).block) == 1
                    })
                    .collect();
                for leaf in shorter {
                    let block = self.remove(leaf);
                    pool.drop_held(block);
                }
                let leaf = self.add(pool, cur, rest.to_vec(), table[whole]);
                self.node_mut(cur).partial.push(leaf);
                self.touch(&[leaf]);
            }
        }
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
        root.partial.clear();
        self.spare.clear();
        self.leaves.clear();
    }

    fn add(&mut self, pool: &mut BlockPool, parent: usize, tokens: Vec<u32>, block: i64) -> usize {
        pool.hold(block);
        let p = self.node(parent);
        if parent != ROOT && p.is_leaf() {
            self.leaves.remove(&(p.last_used, parent));
        }
        let node = Node {
            parent,
            tokens,
            block,
            full: HashMap::new(),
            partial: Vec::new(),
            last_used: 0,
        };
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
        } else {
            parent.partial.retain(|&c| c != id);
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
            let linked = if node.tokens.len() == self.block_size {
                parent.full.get(&node.tokens) == Some(&id)
            } else {
                if !node.is_leaf() {
                    return Err(format!("partial node {id} has children"));
                }
                !node.tokens.is_empty() && parent.partial.contains(&id)
            };
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
        Ok(())
    }
}
