//! The memory plan: what training a model takes per GPU, estimated from its config before
//! anything is loaded, so that a run that cannot fit stops at once with what would fit instead of
//! dying later in an allocation.
//!
//! Per GPU, in bytes (`P` parameters, `b` bytes per model value, `W` ranks, sharded or not):
//! - weights `P·b` (sharded: `P·b/W`, plus the units gathered at once: the one running, the one
//!   prefetched, and a tied embedding kept through the pass);
//! - gradients `P·b` and their fp32 copy `4P` at the optimizer step (sharded: the fp32 shard
//!   `4P/W`, plus the gathered units' gradients);
//! - fp32 master weights `4P` when the model is not fp32, and the AdamW moments `8P` (both `/W`
//!   sharded);
//! - a frozen reference (`P·b`, `/W` sharded) and a PPO critic (about a second policy:
//!   weights, gradients, fp32 masters and moments, `/W` sharded);
//! - activations of one micro-batch of `T` tokens: every block's saved tensors (about
//!   `T·b·(6h + 2q + 2kv + 4i)` per block), or with recomputation only the blocks' inputs
//!   (`T·h·b` each) plus one block's; and the head's fp32 logits over one chunk of positions;
//! - beside a sharded trainer, a colocated rollout engine's own copy of the weights (`P·b`) and
//!   at least one sequence of KV cache.
//!
//! These are estimates of the dominant terms (CUDA's own context, allocator fragmentation and
//! small buffers are the margin); the plan asks for 5 % of the GPU to stay free.

use crate::TrainError;
use ooze_model::ModelConfig;

/// What the trainer holds beside the policy, and how.
#[derive(Debug, Clone)]
pub struct MemoryInputs<'a> {
    pub config: &'a ModelConfig,
    /// Bytes per value of the model's dtype (2 for bf16).
    pub value_bytes: u64,
    pub ranks: u64,
    pub sharded: bool,
    pub tokens_per_micro_batch: u64,
    pub recompute: bool,
    pub reference: bool,
    pub critic: bool,
    /// A colocated rollout engine: the bytes of one sequence's KV cache.
    pub engine_sequence_bytes: Option<u64>,
}

/// The estimate, part by part.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    pub parts: Vec<(&'static str, u64)>,
}

/// Head positions scored at once (`ScoreOptions::chunk_tokens`).
const HEAD_CHUNK: u64 = 1024;
/// Share of the GPU the plan leaves free.
const MARGIN: f64 = 0.05;

const GIB: f64 = (1u64 << 30) as f64;

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB)
}

/// Parameter counts: the whole model, each block, and the embedding matrix.
fn counts(c: &ModelConfig) -> (u64, u64, u64) {
    let total = c.num_parameters() as u64;
    let embed = (c.vocab_size * c.hidden_size) as u64;
    let outside = embed + if c.tie_word_embeddings { 0 } else { embed } + c.hidden_size as u64;
    let block = (total - outside) / (c.num_layers.max(1) as u64);
    (total, block, embed)
}

/// The number of parameters of a model of this config.
pub fn parameter_count(c: &ModelConfig) -> u64 {
    counts(c).0
}

impl MemoryPlan {
    pub fn estimate(m: &MemoryInputs<'_>) -> MemoryPlan {
        let c = m.config;
        let (p, block, embed) = counts(c);
        let b = m.value_bytes;
        let w = if m.sharded { m.ranks.max(1) } else { 1 };
        let fp32_master = if b == 4 { 0 } else { 4 * p };
        let mut parts = Vec::new();
        let largest_unit = block.max(embed);
        let in_flight = if m.sharded {
            2 * largest_unit + if c.tie_word_embeddings { embed } else { 0 }
        } else {
            0
        };
        parts.push(("policy weights", p * b / w + in_flight * b));
        let grads = if m.sharded {
            4 * p / w + in_flight * (b + 4)
        } else {
            p * b + 4 * p
        };
        parts.push(("gradients", grads));
        if fp32_master > 0 {
            parts.push(("fp32 master weights", fp32_master / w));
        }
        parts.push(("AdamW moments (fp32)", 8 * p / w));
        if m.reference {
            // Sharded beside a sharded policy; its units are gathered into the policy's room.
            parts.push(("reference model", p * b / w));
        }
        if m.critic {
            // Sharded beside a sharded policy: its units are gathered into the policy's room.
            let critic = if m.sharded {
                p * (b + 4 + 4 + 8) / w
            } else {
                p * (2 * b + 4 + 4 + 8)
            };
            parts.push(("critic (weights, gradients, optimizer)", critic));
        }
        let (h, inter) = (c.hidden_size as u64, c.intermediate_size as u64);
        let (q, kv) = (
            (c.num_heads * c.head_dim) as u64,
            (c.num_kv_heads * c.head_dim) as u64,
        );
        let t = m.tokens_per_micro_batch;
        let per_block = t * b * (6 * h + 2 * q + 2 * kv + 4 * inter);
        let layers = c.num_layers as u64;
        let recompute = m.recompute || m.sharded;
        let blocks = if recompute {
            layers * t * h * b + per_block
        } else {
            layers * per_block
        };
        let head = 3 * HEAD_CHUNK.min(t) * c.vocab_size as u64 * 4;
        parts.push(("activations", blocks + head));
        if let Some(sequence) = m.engine_sequence_bytes {
            if m.sharded {
                parts.push(("rollout engine's weights", p * b));
            }
            parts.push(("KV cache (at least one sequence)", sequence));
        }
        MemoryPlan { parts }
    }

    pub fn total(&self) -> u64 {
        self.parts.iter().map(|(_, b)| b).sum()
    }

    /// Whether it fits in a GPU of `capacity` bytes (with the margin left free).
    pub fn fits(&self, capacity: u64) -> bool {
        self.total() as f64 <= capacity as f64 * (1.0 - MARGIN)
    }

    /// The parts, one per line.
    pub fn describe(&self) -> String {
        let mut out: Vec<String> = self
            .parts
            .iter()
            .map(|(name, bytes)| format!("  {name}: {}", gib(*bytes)))
            .collect();
        out.push(format!("  total: {}", gib(self.total())));
        out.join("\n")
    }
}

/// Checks `inputs` against a GPU of `capacity` bytes; the error names every part, the GPU's
/// memory and what would fit: sharding, more ranks, recomputation, a smaller micro-batch.
pub fn check(inputs: &MemoryInputs<'_>, capacity: u64, gpu: &str) -> Result<(), TrainError> {
    let plan = MemoryPlan::estimate(inputs);
    if plan.fits(capacity) {
        return Ok(());
    }
    let fits = |m: &MemoryInputs<'_>| MemoryPlan::estimate(m).fits(capacity);
    let mut ways = Vec::new();
    let sharded = MemoryInputs {
        sharded: true,
        ..inputs.clone()
    };
    if !inputs.sharded && inputs.ranks > 1 && fits(&sharded) {
        ways.push(format!(
            "shard the model over the {} ranks (trainer.sharding = \"sharded\", `--sharding sharded`)",
            inputs.ranks
        ));
    }
    if let Some(ranks) = (2..=1024u64).find(|&r| {
        fits(&MemoryInputs {
            ranks: r,
            ..sharded.clone()
        })
    }) {
        if ranks > inputs.ranks {
            ways.push(format!("{ranks} GPUs, sharded"));
        }
    }
    if !inputs.recompute && !inputs.sharded {
        let recomputed = MemoryInputs {
            recompute: true,
            ..inputs.clone()
        };
        if fits(&recomputed) {
            ways.push("recomputed activations (trainer.recompute_activations = true)".to_owned());
        }
    }
    let smaller = (0..=12)
        .map(|k| inputs.tokens_per_micro_batch >> k)
        .filter(|&t| t >= 256)
        .find(|&t| {
            fits(&MemoryInputs {
                tokens_per_micro_batch: t,
                ..inputs.clone()
            })
        });
    if let Some(t) = smaller {
        if t < inputs.tokens_per_micro_batch {
            ways.push(format!(
                "micro-batches of {t} tokens (trainer.max_tokens_per_micro_batch, `--micro-batch-tokens`)"
            ));
        }
    }
    if ways.is_empty() {
        ways.push("none of sharding, more GPUs (up to 1024), recomputation or smaller micro-batches fits: use a smaller model".to_owned());
    }
    Err(TrainError::Config(format!(
        "the model does not fit: training it takes about {} per GPU and {gpu} has {} ({} ranks, {}):\n{}\nwhat would fit: {}",
        gib(plan.total()),
        gib(capacity),
        inputs.ranks,
        if inputs.sharded { "sharded" } else { "each holding the whole model" },
        plan.describe(),
        ways.join("; ")
    )))
}

/// Whether ranks should shard a model under `sharding` (Auto: when a whole copy per GPU does not
/// fit and the sharded one does), after checking that the chosen way fits this GPU. On the CPU
/// (no capacity known) Auto replicates.
pub fn choose(
    sharding: crate::Sharding,
    inputs: &MemoryInputs<'_>,
    gpu: Option<(u64, &str)>,
) -> Result<bool, TrainError> {
    let sharded = match sharding {
        crate::Sharding::Replicated => false,
        crate::Sharding::Sharded => true,
        crate::Sharding::Auto => match gpu {
            Some((capacity, _)) if inputs.ranks > 1 => !MemoryPlan::estimate(&MemoryInputs {
                sharded: false,
                ..inputs.clone()
            })
            .fits(capacity),
            _ => false,
        },
    };
    if let Some((capacity, name)) = gpu {
        check(
            &MemoryInputs {
                sharded,
                ..inputs.clone()
            },
            capacity,
            name,
        )?;
    }
    Ok(sharded)
}

/// The capacity and name of the GPU a device is, when it is one.
pub fn gpu_of(device: ooze_torch::tch::Device) -> Option<(u64, String)> {
    let ooze_torch::tch::Device::Cuda(i) = device else {
        return None;
    };
    let gpus = ooze_torch::cuda_driver::list_gpus().ok()?;
    let gpu = gpus.into_iter().find(|g| g.index == i)?;
    Some((gpu.total_memory_bytes, format!("GPU {i} ({})", gpu.name)))
}

/// Bytes per value of a dtype.
pub fn value_bytes(kind: ooze_torch::tch::Kind) -> u64 {
    use ooze_torch::tch::Kind;
    match kind {
        Kind::BFloat16 | Kind::Half => 2,
        Kind::Double => 8,
        _ => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ooze_model::init::{InitOptions, Size};
    use ooze_model::Family;

    fn inputs(config: &ModelConfig, ranks: u64, sharded: bool) -> MemoryInputs<'_> {
        MemoryInputs {
            config,
            value_bytes: 2,
            ranks,
            sharded,
            tokens_per_micro_batch: 16_384,
            recompute: false,
            reference: false,
            critic: false,
            engine_sequence_bytes: None,
        }
    }

    fn qwen25_7b() -> ModelConfig {
        InitOptions::new(Family::Qwen2, Size::Qwen7b)
            .model_config()
            .unwrap()
    }

    #[test]
    fn counts_the_parameters_of_qwen25_7b() {
        // transformers reports 7,615,616,512 parameters for Qwen2.5-7B.
        assert_eq!(parameter_count(&qwen25_7b()), 7_615_616_512);
    }

    #[test]
    fn a_7b_model_does_not_fit_one_h200_whole_and_fits_two_sharded() {
        let c = qwen25_7b();
        let h200 = 140 * (1u64 << 30);
        let whole = inputs(&c, 1, false);
        let e = check(&whole, h200, "NVIDIA H200").unwrap_err().to_string();
        for part in [
            "policy weights",
            "gradients",
            "fp32 master weights",
            "AdamW moments",
            "activations",
            "NVIDIA H200 has 140.0 GiB",
            "2 GPUs, sharded",
        ] {
            assert!(e.contains(part), "{part:?} in {e}");
        }
        assert!(MemoryPlan::estimate(&inputs(&c, 2, true)).fits(h200));
        // Auto shards two ranks of it and keeps a small model whole.
        assert!(choose(
            crate::Sharding::Auto,
            &inputs(&c, 2, false),
            Some((h200, "H200"))
        )
        .unwrap());
        let small = InitOptions::new(Family::Qwen2, Size::Qwen05b)
            .model_config()
            .unwrap();
        assert!(!choose(
            crate::Sharding::Auto,
            &inputs(&small, 2, false),
            Some((h200, "H200"))
        )
        .unwrap());
        // Sharding divides the optimizer state by the ranks.
        let adam = |plan: &MemoryPlan| {
            plan.parts
                .iter()
                .find(|p| p.0.starts_with("AdamW"))
                .unwrap()
                .1
        };
        let (one, four) = (
            MemoryPlan::estimate(&inputs(&c, 4, false)),
            MemoryPlan::estimate(&inputs(&c, 4, true)),
        );
        assert_eq!(adam(&one), 4 * adam(&four));
    }

    #[test]
    fn suggests_smaller_micro_batches_when_only_activations_overflow() {
        let small = InitOptions::new(Family::Qwen2, Size::Qwen05b)
            .model_config()
            .unwrap();
        let mut big_batch = inputs(&small, 1, false);
        big_batch.tokens_per_micro_batch = 1 << 18;
        let e = check(&big_batch, 80 * (1u64 << 30), "H100")
            .unwrap_err()
            .to_string();
        assert!(e.contains("micro-batches of"), "{e}");
        assert!(e.contains("recomputed activations"), "{e}");
    }
}
