//! Packed sequences laid out in dense slots, for cuDNN's fused attention in training
//! (`shim/slot_attention.cpp`). On Hopper, cuDNN's kernels run causal attention 1.5× (head size
//! 64) to 1.8× (128) faster than FlashAttention-2, forward and backward together, but only over
//! dense batches `[sequences, heads, length, head_dim]` (PyTorch 2.11's packed path for cuDNN
//! rebuilds its plan on every call and returns wrong gradients). So the sequences of a packed
//! micro-batch go into slots: sequences of similar length share a group whose slot length is
//! theirs rounded up, each right-padded with zeros (causal attention leaves real rows as they
//! are); the slots are views of the packed tensors when every sequence fills its own, copies
//! otherwise. ATen caches a plan per (sequences, length), which is why lengths are bucketed. The slots
//! pay for the padding's work and for the copies, so [`SlotLayout::plan`] keeps
//! FlashAttention-2 whenever its estimate of the slots' time is not below FlashAttention-2's.

#[cfg(ooze_cuda_kernels)]
use super::ffi;
use crate::tch::{Device, Tensor};
use crate::transfer::upload;
use std::collections::BTreeMap;

/// Where each token of a packed micro-batch goes among the slots, and the slots' groups.
#[cfg_attr(not(ooze_cuda_kernels), allow(dead_code))]
pub struct SlotLayout {
    /// Each packed token's row in the slot buffer (int64 `[tokens]`, on the device); `None` when
    /// every token already sits in its row (sequences as long as their slots, longest slots
    /// first): the slots are then views of the packed tensors, with no copies.
    pub(crate) rows: Option<Tensor>,
    /// `(first row, sequences, slot length)` of each group, one after another.
    pub(crate) groups: Vec<i64>,
}

/// The host side of a [`SlotLayout`]: the groups (first row, sequences, slot length), each packed
/// token's row, and whether those rows are the tokens' own (no copies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotPlan {
    pub groups: Vec<[i64; 3]>,
    pub rows: Vec<i64>,
    pub identity: bool,
}

/// FlashAttention-2's time per (query, key) pair of one layer's forward and backward, per unit of
/// heads × head size, in µs (H200: 0.5B's 14 × 64 heads, 8 × 2,048 tokens, 1.05 ms; Qwen3-4B's
/// 32 × 128, 2 × 4,096, 3.5 ms; docs/benchmarks.md), and cuDNN's speed-up over it.
fn flash_pair_cost(head_dim: i64) -> (f64, f64) {
    if head_dim >= 128 {
        (2.5e-8, 1.8)
    } else {
        (3.5e-8, 1.5)
    }
}

/// A cuDNN call's own cost (forward and backward of one group, one layer), and the slots' copies
/// per slot row and unit of heads × head size, in µs.
const GROUP_COST_US: f64 = 30.0;
const COPY_COST_US: f64 = 7e-6;

/// A sequence of `len` tokens gets a slot of `len` rounded up to an eighth of the power of two at
/// or above it (at least 64 rows): at most 25% longer, and few distinct lengths.
pub fn slot_length(len: i64) -> i64 {
    let pow = (len.max(1) as u64).next_power_of_two() as i64;
    let step = (pow / 8).max(64);
    (len + step - 1) / step * step
}

impl SlotPlan {
    /// Slots for sequences of `lengths` (packed one after another) under attention with `heads`
    /// query heads of `head_dim`, or `None` where FlashAttention-2 is estimated as fast.
    pub fn new(lengths: &[i64], heads: i64, head_dim: i64) -> Option<SlotPlan> {
        let plan = SlotPlan::build(lengths)?;
        (plan.estimated_us(heads, head_dim) < flash_estimated_us(lengths, heads, head_dim))
            .then_some(plan)
    }

    /// Slots for sequences of `lengths`, whatever they cost (`None` for no sequences or an empty
    /// one): groups by slot length, longest first, sequences in their packed order within a group.
    pub fn build(lengths: &[i64]) -> Option<SlotPlan> {
        if lengths.is_empty() || lengths.iter().any(|&l| l <= 0) {
            return None;
        }
        let mut by_length: BTreeMap<std::cmp::Reverse<i64>, Vec<usize>> = BTreeMap::new();
        for (i, &l) in lengths.iter().enumerate() {
            by_length
                .entry(std::cmp::Reverse(slot_length(l)))
                .or_default()
                .push(i);
        }
        let mut starts = vec![0i64; lengths.len() + 1];
        for (i, &l) in lengths.iter().enumerate() {
            starts[i + 1] = starts[i] + l;
        }
        let mut rows = vec![0i64; starts[lengths.len()] as usize];
        let mut groups = Vec::with_capacity(by_length.len());
        let mut first_row = 0;
        for (std::cmp::Reverse(length), members) in by_length {
            for (slot, &i) in members.iter().enumerate() {
                let base = first_row + slot as i64 * length;
                for t in 0..lengths[i] {
                    rows[(starts[i] + t) as usize] = base + t;
                }
            }
            groups.push([first_row, members.len() as i64, length]);
            first_row += members.len() as i64 * length;
        }
        // No copies when every token already sits in its row.
        let identity =
            rows.iter().enumerate().all(|(i, &r)| r == i as i64) && first_row == rows.len() as i64;
        Some(SlotPlan {
            groups,
            rows,
            identity,
        })
    }

    /// The estimated time of one layer's attention (forward and backward) over these slots, µs.
    fn estimated_us(&self, heads: i64, head_dim: i64) -> f64 {
        let (pair_cost, speedup) = flash_pair_cost(head_dim);
        let width = (heads * head_dim) as f64;
        self.groups
            .iter()
            .map(|&[_, sequences, length]| {
                let rows = (sequences * length) as f64;
                let copies = if self.identity {
                    0.0
                } else {
                    rows * COPY_COST_US * width
                };
                rows * length as f64 * pair_cost * width / speedup + GROUP_COST_US + copies
            })
            .sum()
    }
}

/// FlashAttention-2's estimated time for the same layer, µs.
fn flash_estimated_us(lengths: &[i64], heads: i64, head_dim: i64) -> f64 {
    let (pair_cost, _) = flash_pair_cost(head_dim);
    let pairs: f64 = lengths.iter().map(|&l| (l * l) as f64).sum();
    pairs * pair_cost * (heads * head_dim) as f64
}

impl SlotLayout {
    /// The slots of [`SlotPlan::new`] on `device`, when cuDNN's fused attention runs there
    /// ([`slot_attention_usable`]) and the estimate favours it.
    pub fn plan(lengths: &[i64], heads: i64, head_dim: i64, device: Device) -> Option<SlotLayout> {
        if !slot_attention_usable(device) {
            return None;
        }
        Some(SlotLayout::from_plan(
            &SlotPlan::new(lengths, heads, head_dim)?,
            device,
        ))
    }

    /// `plan`'s slots on `device` (taken as they are: for tests and comparisons).
    pub fn from_plan(plan: &SlotPlan, device: Device) -> SlotLayout {
        SlotLayout {
            rows: (!plan.identity).then(|| upload(&plan.rows, device)),
            groups: plan.groups.iter().flatten().copied().collect(),
        }
    }
}

/// Whether cuDNN's fused attention runs on `device`: a CUDA build with ooze's kernels, cuDNN 9
/// enabled, a Hopper or newer GPU (asked once per process, for the first GPU asked about).
pub fn slot_attention_usable(device: Device) -> bool {
    #[cfg(ooze_cuda_kernels)]
    if let Device::Cuda(index) = device {
        static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        return super::available()
            && *USABLE.get_or_init(|| {
                // SAFETY: a plain query; the shim catches every exception.
                unsafe { ffi::ooze_slot_attention_usable(index as i64) == 1 }
            });
    }
    let _ = device;
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_lengths_round_up_by_an_eighth_of_the_power_of_two() {
        for (len, slot) in [
            (1, 64),
            (64, 64),
            (65, 128),
            (300, 320),
            (1000, 1024),
            (1024, 1024),
            (1025, 1280),
            (2048, 2048),
            (2049, 2560),
            (4000, 4096),
        ] {
            assert_eq!(slot_length(len), slot, "length {len}");
        }
        for len in 1..5000i64 {
            let s = slot_length(len);
            let step = ((len as u64).next_power_of_two() as i64 / 8).max(64);
            assert!(s >= len && s % 64 == 0 && s - len < step, "{len} -> {s}");
            // Past 256 tokens, at most a quarter of padding.
            assert!(len < 256 || (s - len) * 4 <= len, "{len} -> {s}");
        }
    }

    #[test]
    fn equal_long_sequences_take_one_group_in_packed_order() {
        let plan = SlotPlan::new(&[2048; 8], 14, 64).expect("cuDNN pays off");
        assert_eq!(plan.groups, vec![[0, 8, 2048]]);
        assert_eq!(plan.rows, (0..8 * 2048).collect::<Vec<i64>>());
        assert!(plan.identity, "no copies");
        // One token short of its slot: the same groups, through copies.
        let mut lengths = [2048; 8];
        lengths[3] = 2047;
        let plan = SlotPlan::new(&lengths, 14, 64).expect("cuDNN pays off");
        assert_eq!(plan.groups, vec![[0, 8, 2048]]);
        assert!(!plan.identity);
        // Sequence 3's last token, then sequence 4's first at the start of its slot.
        assert_eq!(
            plan.rows[4 * 2048 - 2..4 * 2048],
            [3 * 2048 + 2046, 4 * 2048]
        );
    }

    #[test]
    fn every_token_gets_its_own_row_inside_its_sequences_slot() {
        let lengths = [1900, 700, 2048, 650, 4000, 1000];
        let plan = SlotPlan::new(&lengths, 32, 128).expect("cuDNN pays off");
        // Longest slots first; sequences keep their packed order within a group.
        assert_eq!(
            plan.groups,
            vec![
                [0, 1, 4096],
                [4096, 2, 2048],
                [8192, 1, 1024],
                [9216, 2, 768]
            ]
        );
        assert!(!plan.identity);
        let mut seen = std::collections::HashSet::new();
        let mut start = 0;
        for (i, &l) in lengths.iter().enumerate() {
            let first = plan.rows[start];
            let group = plan
                .groups
                .iter()
                .find(|g| first >= g[0] && first < g[0] + g[1] * g[2])
                .expect("a row inside a group");
            assert_eq!(
                (first - group[0]) % group[2],
                0,
                "sequence {i} starts its slot"
            );
            for t in 0..l as usize {
                assert_eq!(plan.rows[start + t], first + t as i64);
                assert!(seen.insert(plan.rows[start + t]));
            }
            start += l as usize;
        }
    }

    #[test]
    fn flash_attention_stays_where_slots_would_cost_more() {
        // Short sequences: the calls' own cost outweighs the attention.
        assert_eq!(SlotPlan::new(&[40, 30, 20], 14, 64), None);
        // One long sequence among many short ones in their own groups: still worth it.
        assert!(SlotPlan::new(&[4096, 100, 90, 80], 32, 128).is_some());
        // Bad input never plans.
        assert_eq!(SlotPlan::new(&[], 14, 64), None);
        assert_eq!(SlotPlan::build(&[100, 0]), None);
        // Sequences as long as their slots but not longest first: copies.
        let plan = SlotPlan::build(&[256, 512]).unwrap();
        assert_eq!(plan.groups, vec![[0, 1, 512], [512, 1, 256]]);
        assert!(!plan.identity);
        assert!(SlotPlan::build(&[512, 256]).unwrap().identity);
    }
}
