//! A seeded order over a dataset, epoch after epoch, that resumes from a [`Position`]: each epoch
//! is the indices `0..len` shuffled with a seed derived from the run's seed and the epoch (or in
//! order without shuffling), so the position is two numbers and a resumed run takes exactly the
//! items an uninterrupted one would. Used for RL prompts and SFT conversations.

use crate::SplitMix64;
use serde::{Deserialize, Serialize};

/// Where a run is in its prompts: the epoch and how many of its prompts were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Position {
    pub epoch: u64,
    pub offset: usize,
}

/// A seeded order over `len` prompts, epoch after epoch, that resumes from a [`Position`].
#[derive(Debug, Clone)]
pub struct PromptOrder {
    len: usize,
    seed: u64,
    shuffle: bool,
    position: Position,
    order: Vec<usize>,
}

impl PromptOrder {
    pub fn new(len: usize, seed: u64, shuffle: bool, position: Position) -> PromptOrder {
        let mut p = PromptOrder {
            len,
            seed,
            shuffle,
            position,
            order: Vec::new(),
        };
        p.order = p.epoch_order(position.epoch);
        p
    }

    fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            SplitMix64::new(self.seed ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .shuffle(&mut order);
        }
        order
    }

    /// The next `n` row indices (crossing into later epochs as needed).
    pub fn take(&mut self, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n && self.len > 0 {
            if self.position.offset == self.len {
                self.position = Position {
                    epoch: self.position.epoch + 1,
                    offset: 0,
                };
                self.order = self.epoch_order(self.position.epoch);
            }
            out.push(self.order[self.position.offset]);
            self.position.offset += 1;
        }
        out
    }

    pub fn position(&self) -> Position {
        self.position
    }
}
