//! Where attention reads and writes: the KV memory the callers own ([`KvCache`] for one batch of
//! equal-length sequences, [`PagedKv`] for the engine's blocks), the attention layouts a
//! forward pass can use ([`Attention`]), and the masks and one-token decode attention they need.

use crate::config::ModelConfig;
use crate::rope::RopeTables;
use ooze_torch::tch::{Device, Kind, Tensor};
use ooze_torch::transfer::upload;

/// The keys (or values) of the first `read_len` positions of each row in a layer's paged memory
/// `[blocks, block_size, kv_heads, head_dim]`, read through `tables [B, W]`, as
/// `[B, kv_heads, read_len, head_dim]`. Whole blocks are gathered, one index per table entry, so no
/// per-position index is built (on a CPU the copy itself takes as long either way).
pub(crate) fn gather_blocks(layer: &Tensor, tables: &Tensor, read_len: i64) -> Tensor {
    let size = layer.size();
    let (block_size, kv, d) = (size[1], size[2], size[3]);
    let b = tables.size()[0];
    let width = (read_len + block_size - 1) / block_size;
    layer
        .index_select(0, &tables.narrow(1, 0, width).reshape([-1]))
        .view([b, width * block_size, kv, d])
        .narrow(1, 0, read_len)
        .transpose(1, 2)
}

/// Key/value tensors of one layer for a batch of sequences that all have `len` cached tokens.
pub struct KvCache {
    pub(crate) layers: Vec<Option<(Tensor, Tensor)>>,
    pub(crate) len: i64,
}

impl KvCache {
    pub fn new(num_layers: usize) -> KvCache {
        KvCache {
            layers: (0..num_layers).map(|_| None).collect(),
            len: 0,
        }
    }
    /// Tokens cached so far (per sequence).
    pub fn len(&self) -> i64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Key/value memory in fixed-size blocks: per layer `[blocks + 1, block_size, kv_heads, head_dim]`
/// for keys and for values. A sequence's positions live in the blocks its block table lists
/// (position `p` at offset `p % block_size` of block `table[p / block_size]`), so memory follows
/// actual lengths and sequences that start alike can share blocks. The engine owns it and decides
/// which blocks a sequence uses; the last block (index `blocks`) is scratch that padding rows write
/// into and nobody reads. One block of a sequence's whole length is the fixed-slot layout.
pub struct PagedKv {
    pub(crate) k: Vec<Tensor>,
    pub(crate) v: Vec<Tensor>,
    blocks: i64,
    block_size: i64,
}

impl PagedKv {
    /// Allocates `blocks` blocks of `block_size` tokens (plus the scratch block) for `config` on
    /// `device` in `kind`.
    pub fn new(
        config: &ModelConfig,
        blocks: i64,
        block_size: i64,
        device: Device,
        kind: Kind,
    ) -> PagedKv {
        let shape = [blocks + 1, block_size, config.num_kv_heads, config.head_dim];
        let layer = || Tensor::zeros(shape, (kind, device));
        PagedKv {
            k: (0..config.num_layers).map(|_| layer()).collect(),
            v: (0..config.num_layers).map(|_| layer()).collect(),
            blocks,
            block_size,
        }
    }

    /// Bytes one cached token takes across all layers.
    pub fn bytes_per_token(config: &ModelConfig, kind: Kind) -> i64 {
        2 * config.num_layers
            * config.num_kv_heads
            * config.head_dim
            * kind.elt_size_in_bytes() as i64
    }

    pub fn block_size(&self) -> i64 {
        self.block_size
    }

    /// The scratch block (the one after the `blocks` sequences can use): padding rows write here,
    /// and table entries past a sequence's end name it.
    pub fn scratch(&self) -> i64 {
        self.blocks
    }

    /// Copies the first `len` positions of block `from` into block `to` (a shared block that a
    /// sequence goes on writing into: copy on write).
    pub fn copy_block(&mut self, from: i64, to: i64, len: i64) {
        for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
            let src = layer.narrow(0, from, 1).narrow(1, 0, len);
            layer.narrow(0, to, 1).narrow(1, 0, len).copy_(&src);
        }
    }
}

/// Keys read from paged memory are padded to a multiple of this many positions: the fused attention
/// kernels want an aligned bias, and fewer distinct shapes means fewer kernel plans.
pub const KEY_ALIGN: i64 = 16;

pub(crate) fn round_up(n: i64, to: i64) -> i64 {
    (n + to - 1) / to * to
}

/// The arithmetic of a bf16 model's passes over packed sequences on a GPU, outside deterministic
/// numerics (which run split attention and fp32 logits everywhere): which kernel attends
/// ([`Attention::Packed`]) and how the LM head makes the logits of a pass with gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arithmetic {
    /// What the engine's kernels reproduce, so the engine's log-probs equal these passes'
    /// bitwise: FlashAttention-2 (varlen, rows of up to 4,096 keys) and fp32 logits from the
    /// head's matmul. Scoring, RL steps.
    #[default]
    Engine,
    /// cuDNN's fused attention over dense slots where it runs (Hopper) and is estimated faster
    /// (`ooze_torch::kernels::SlotLayout`), else FlashAttention-2: 1.5–1.8× faster attention,
    /// ~1e-3 (relative) from FlashAttention-2's outputs, which grows to ~1e-2 in log-probs over
    /// 24 layers and 2,000 tokens. And bf16 logits from the head's matmul, as autocast makes
    /// them (`ooze_torch::kernels::HeadLogits::Bf16`): a third of the bytes fp32 logits and
    /// their rounded copy cost. Supervised steps, by default.
    Fastest,
}

/// How the tokens of a batch may attend to each other.
pub enum Attention<'a> {
    /// `[B, T]` right-padded sequences; position `t` sees positions `≤ t` of its own row.
    Causal,
    /// `[1, N]` packed sequences: token `i` sees token `j ≤ i` only when both belong to the same
    /// sequence. The lengths must sum to `N`.
    Packed { lengths: &'a [i64] },
    /// New tokens `[B, T]` appended to the cache; they see the whole cache and causally each other.
    Cached(&'a mut KvCache),
    /// New tokens `[B, T]`, row `b` appended to its sequence after its `past[b]` cached tokens, in
    /// the blocks `tables[b]` lists (which must cover the row's real new tokens; padding at the end
    /// of a row goes to the scratch block); they see their own sequence's history and causally
    /// each other.
    Paged {
        cache: &'a mut PagedKv,
        tables: &'a [&'a [i64]],
        past: &'a [i64],
    },
    /// One new token per row (`[B, 1]`), everything on the device: row `b` is appended after
    /// `past[b]` tokens to the sequence whose blocks are `tables[b]` (`[B, W]`, padded with the
    /// scratch block) and attends over its first `read_len` positions (`read_len ≤ W · block
    /// size`). Nothing here synchronises with the host, so a step can be captured in a CUDA graph.
    /// `write_cells [B]`: the flat cell (block · block size + offset) of each row's new token
    /// (position `past[b]` through `tables[b]`); `rope`: the rotary tables the rows' are gathered
    /// from ([`Decoder::rope_tables`](crate::Decoder::rope_tables), longer than every position).
    PagedDecode {
        cache: &'a mut PagedKv,
        tables: &'a Tensor,
        past: &'a Tensor,
        read_len: i64,
        write_cells: &'a Tensor,
        rope: &'a RopeTables,
    },
}

/// Where a layer's new keys and values go, and what they are read back with.
pub(crate) enum KvTarget<'a> {
    None,
    Contiguous(&'a mut KvCache),
    Paged {
        cache: &'a mut PagedKv,
        /// `[B, T]` flat cell (block · block size + offset) of every new token: where to write.
        write_cells: Tensor,
        /// `[B, W]` block tables and `[B]` cached lengths, for the fused decode kernels.
        tables: Tensor,
        past: Tensor,
        read_len: i64,
    },
}

/// `[B, 1, T, read_len]` mask of `T` new tokens per row after `past [B]` cached ones: query `i`
/// of row `b` sees key `j` when `j ≤ past[b] + i`.
pub(crate) fn paged_mask(past: &Tensor, t: i64, read_len: i64) -> Tensor {
    let device = past.device();
    let limit = past.view([-1, 1, 1]) + Tensor::arange(t, (Kind::Int64, device)).view([1, t, 1]);
    let keys = Tensor::arange(read_len, (Kind::Int64, device)).view([1, 1, read_len]);
    keys.le_tensor(&limit).unsqueeze(1)
}

impl KvTarget<'_> {
    /// The paged target and mask of `t` new tokens per row after `past[b]` cached ones, block
    /// tables on the host. Keys are read up to the longest row, rounded up to [`KEY_ALIGN`];
    /// table entries past a row's own blocks name the scratch block (the row's padding writes
    /// there, and its reads there are masked).
    pub(crate) fn paged_from_host<'c>(
        cache: &'c mut PagedKv,
        tables: &[&[i64]],
        past: &[i64],
        t: i64,
        device: Device,
    ) -> (KvTarget<'c>, Tensor) {
        let read_len = round_up(past.iter().max().copied().unwrap_or(0) + t, KEY_ALIGN);
        let bs = cache.block_size();
        let width = ((read_len + bs - 1) / bs) as usize;
        let mut flat = Vec::with_capacity(tables.len() * width);
        for table in tables {
            let start = flat.len();
            flat.extend_from_slice(&table[..table.len().min(width)]);
            flat.resize(start + width, cache.scratch());
        }
        // Uploads that do not wait for the device (the engine queues a step while the one before
        // it still runs).
        let tables = upload(&flat, device).view([-1, width as i64]);
        let past = upload(past, device);
        let mask = paged_mask(&past, t, read_len);
        (KvTarget::paged(cache, tables, past, t, read_len), mask)
    }

    /// The paged target of `t` new tokens per row after `past [B]` cached ones, for block tables
    /// `tables [B, W]` (device tensors), reading `read_len ≤ W · block size` positions.
    pub(crate) fn paged(
        cache: &mut PagedKv,
        tables: Tensor,
        past: Tensor,
        t: i64,
        read_len: i64,
    ) -> KvTarget<'_> {
        let new = past.unsqueeze(1) + Tensor::arange(t, (Kind::Int64, past.device())).unsqueeze(0);
        KvTarget::Paged {
            write_cells: cells(&tables, &new, cache.block_size()),
            tables,
            past,
            read_len,
            cache,
        }
    }
}

/// `positions [B, N]` → their flat cells (block · block size + offset) through `tables [B, W]`.
fn cells(tables: &Tensor, positions: &Tensor, block_size: i64) -> Tensor {
    tables.gather(1, &positions.divide_scalar_mode(block_size, "floor"), false) * block_size
        + positions.remainder(block_size)
}

/// `[B, KV, H/KV, L]` additive bias (0 where attending, −∞ elsewhere) from a `[B, 1, 1, L]` mask.
pub(crate) fn decode_bias(mask: &Tensor, kv: i64, group: i64, kind: Kind) -> Tensor {
    let size = mask.size();
    let (b, len) = (size[0], size[3]);
    Tensor::zeros([b, 1, 1, len], (kind, mask.device()))
        .masked_fill(&mask.logical_not(), f64::NEG_INFINITY)
        .expand([b, kv, group, len], false)
}

/// Attention of one new token per row (`q [B, H, 1, D]`) over its own keys (`k, v [B, KV, L, D]`)
/// on a GPU. The `H / KV` query heads that share a key head are laid out as that head's queries
/// (`[B, KV, H/KV, D]`), so grouped-query attention needs no copies of the keys, and the
/// memory-efficient kernel is called directly (the dispatcher would pick cuDNN, which builds a new
/// plan — tens of milliseconds — for every new key length).
pub(crate) fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
) -> Tensor {
    let (b, h, _, d) = q.size4().expect("invariant: q is [B, H, 1, D]");
    let kv = k.size()[1];
    let grouped = q.reshape([b, kv, h / kv, d]);
    let (out, _, _, _) = Tensor::internal_scaled_dot_product_efficient_attention(
        &grouped,
        k,
        v,
        Some(bias),
        false,
        0.0,
        false,
        scale,
    );
    out.reshape([b, h, 1, d])
}

/// `[1, 1, N, N]` boolean mask: true where query `i` may attend key `j`.
pub(crate) fn packed_mask(lengths: &[i64], device: Device) -> Tensor {
    let segments: Vec<i64> = lengths
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| std::iter::repeat_n(i as i64, n as usize))
        .collect();
    let seg = upload(&segments, device);
    let n = segments.len() as i64;
    let same = seg.unsqueeze(1).eq_tensor(&seg.unsqueeze(0));
    let causal = Tensor::ones([n, n], (Kind::Bool, device)).tril(0);
    same.logical_and(&causal).view([1, 1, n, n])
}

/// Packed sequences laid out as a right-padded batch `[B, L]` (L the longest length) so that
/// plain causal attention does the work: a sequence's queries see only its own keys, and padding
/// (at the end of each row) is never attended by a real query. Costs `B·L²` instead of the dense
/// block-diagonal mask's `N²`.
pub(crate) struct PaddedPacking {
    /// `[B·L]`: the packed token each padded position takes (padding repeats the row's start).
    pub gather: Tensor,
    /// `[N]`: where each packed token sits in the flattened `[B·L]` layout.
    pub scatter: Tensor,
    pub rows: i64,
    pub longest: i64,
}

impl PaddedPacking {
    /// The padded layout, or `None` when the dense mask is cheaper (one long sequence among many
    /// short ones).
    pub fn new(lengths: &[i64], device: Device) -> Option<PaddedPacking> {
        let rows = lengths.len() as i64;
        let longest = lengths.iter().copied().max()?;
        let n: i64 = lengths.iter().sum();
        if rows * longest * longest >= n * n {
            return None;
        }
        let mut gather = Vec::with_capacity((rows * longest) as usize);
        let mut scatter = Vec::with_capacity(n as usize);
        let mut start = 0;
        for (row, &len) in lengths.iter().enumerate() {
            for t in 0..longest {
                gather.push(start + t.min(len - 1));
            }
            scatter.extend((0..len).map(|t| row as i64 * longest + t));
            start += len;
        }
        Some(PaddedPacking {
            gather: upload(&gather, device),
            scatter: upload(&scatter, device),
            rows,
            longest,
        })
    }

    /// `[1, H, N, D]` → `[B, H, L, D]`.
    pub fn to_rows(&self, x: &Tensor) -> Tensor {
        let size = x.size();
        let (h, d) = (size[1], size[3]);
        x.squeeze_dim(0)
            .index_select(1, &self.gather)
            .view([h, self.rows, self.longest, d])
            .transpose(0, 1)
    }

    /// `[B, H, L, D]` → `[1, H, N, D]`.
    pub fn to_packed(&self, x: &Tensor) -> Tensor {
        let size = x.size();
        let (h, d) = (size[1], size[3]);
        x.transpose(0, 1)
            .reshape([h, self.rows * self.longest, d])
            .index_select(1, &self.scatter)
            .unsqueeze(0)
    }
}

/// `[1, 1, T, past + T]` mask for `T` new tokens after `past` cached ones.
pub(crate) fn offset_causal_mask(past: i64, t: i64, device: Device) -> Tensor {
    Tensor::ones([t, past + t], (Kind::Bool, device))
        .tril(past)
        .view([1, 1, t, past + t])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        let m = packed_mask(&[2, 1], Device::Cpu).view([3, 3]);
        let expect =
            Tensor::from_slice(&[true, false, false, true, true, false, false, false, true])
                .view([3, 3]);
        assert!(m.equal(&expect));
        let m = offset_causal_mask(2, 2, Device::Cpu).view([2, 4]);
        let expect =
            Tensor::from_slice(&[true, true, true, false, true, true, true, true]).view([2, 4]);
        assert!(m.equal(&expect));
    }

    #[test]
    fn padded_packing_attends_like_the_block_diagonal_mask() {
        ooze_torch::tch::manual_seed(3);
        let lengths = [3i64, 1, 5, 4];
        let n: i64 = lengths.iter().sum();
        let qkv = |_| Tensor::randn([1, 2, n, 8], (Kind::Float, Device::Cpu));
        let (q, k, v) = (qkv(0), qkv(1), qkv(2));
        let mask = packed_mask(&lengths, Device::Cpu);
        let dense =
            Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, None, false);
        let p = PaddedPacking::new(&lengths, Device::Cpu).expect("padding is cheaper here");
        assert_eq!((p.rows, p.longest), (4, 5));
        let rows = Tensor::scaled_dot_product_attention(
            &p.to_rows(&q),
            &p.to_rows(&k),
            &p.to_rows(&v),
            None::<&Tensor>,
            0.0,
            true,
            None,
            false,
        );
        let padded = p.to_packed(&rows);
        assert_eq!(padded.size(), dense.size());
        let diff = (&padded - &dense).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "padded vs dense attention differ by {diff}");
        // One long sequence among many short ones: the dense mask is cheaper.
        let skewed: Vec<i64> = std::iter::once(64)
            .chain(std::iter::repeat_n(1, 40))
            .collect();
        assert!(PaddedPacking::new(&skewed, Device::Cpu).is_none());
    }
}
