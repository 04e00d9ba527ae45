//! The engine's kernels against what they replace: sampling, fused norms, decode attention (both
//! arithmetics) and FlashAttention-2's order.

use super::*;

/// ooze's CUDA kernels against the libtorch operations they replace: a Qwen3 model (q/k norms in
/// the rotary kernel) decoding in fp32 draws the same seeded tokens with the kernels on and off;
/// the sampling kernel on random logits of four vocabulary sizes gives the same greedy tokens and
/// the same sampled tokens (up to rare ties at a CDF boundary) with the same log-probs; silu·mul is
/// exact.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_kernels_match_libtorch_ops() {
    require_gpu();
    use ooze_engine::sampler::draw;
    use ooze_engine::{start, EngineConfig, SamplingParams};
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    assert!(kernels::available(), "this build has no CUDA kernels");

    let gate_up = Tensor::randn([33, 2 * 4864], (Kind::BFloat16, Device::Cuda(0)));
    let fused = kernels::silu_mul(&gate_up).unwrap();
    let reference = gate_up.narrow(1, 0, 4864).silu() * gate_up.narrow(1, 4864, 4864);
    assert!(fused.equal(&reference), "silu_mul differs from silu * mul");

    // Vocabularies the one-pass sampler takes (128-token chunks, the last one partial or whole,
    // a handful of chunks) and one it does not (not a multiple of 4).
    for vocab in [151_936i64, 128_256, 684, 32_001] {
        let logits = Tensor::randn([64, vocab], (Kind::Float, Device::Cuda(0))) * 3.0;
        let settings = temperature_settings(64);
        let rows = seeded_rows(&settings, 17, 3);
        let with = draw(&logits, &rows);
        kernels::set_enabled(false);
        let without = draw(&logits, &rows);
        kernels::set_enabled(true);
        let mut same = 0;
        for (i, (a, b)) in with.iter().zip(&without).enumerate() {
            if i % 4 == 0 {
                assert_eq!(a.token, b.token, "vocab {vocab}, greedy row {i}");
            }
            if a.token == b.token {
                same += 1;
                assert!(
                    (a.log_prob - b.log_prob).abs() < 1e-4,
                    "vocab {vocab}, row {i}: {} vs {}",
                    a.log_prob,
                    b.log_prob
                );
            }
        }
        assert!(
            same >= 62,
            "vocab {vocab}: only {same} of 64 rows drew the same token"
        );
    }

    let dir = random_model(Family::Qwen3, Size::Small, 21);
    let params = SamplingParams {
        seed: Some(8),
        max_new_tokens: Some(48),
        ignore_eos: Some(true),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut results = Vec::new();
    for on in [true, false] {
        kernels::set_enabled(on);
        let engine = start(
            Decoder::load(dir.path(), Device::Cuda(0), Kind::Float).unwrap(),
            None,
            EngineConfig::new(16, 400, vec![]),
        );
        results.push(generate_all(&runtime, &engine, &sequences(600), &params));
    }
    kernels::set_enabled(true);
    let worst = same_tokens_log_prob_gap(&results[0], &results[1], "kernels on and off");
    assert!(worst < 1e-4, "kernels on vs off log-prob error {worst}");
    eprintln!("kernels on vs off: max |log-prob diff| {worst:.2e}");
}

/// The sampling kernel's log-probs are the trainer's log-prob kernel's, bitwise, for the same fp32
/// logits: greedy and sampled rows, temperatures other than 1, a vocabulary that is not a multiple
/// of 4, and rows that do not start 16-byte aligned.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_sampler_log_probs_equal_trainer_kernel() {
    require_gpu();
    use ooze_engine::sampler::draw;
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    for (vocab, offset) in [(151_936i64, 0i64), (32_001, 0), (151_936, 1)] {
        let wide = Tensor::randn([64, vocab + 1], (Kind::Float, Device::Cuda(0))) * 3.0;
        let logits = wide.narrow(1, offset, vocab);
        let settings = temperature_settings(64);
        let rows = seeded_rows(&settings, 5, 11);
        let draws = draw(&logits, &rows);
        for (i, (d, row)) in draws.iter().zip(&rows).enumerate() {
            assert!(
                i64::from(d.token) < vocab,
                "vocab {vocab}, offset {offset}, row {i}: token {}",
                d.token
            );
            let one = logits.narrow(0, i as i64, 1).contiguous();
            let token = Tensor::from_slice(&[d.token as i64]).to_device(Device::Cuda(0));
            let want = kernels::log_probs(&one, &token, row.params.log_prob_temperature()).unwrap();
            let want = f32::try_from(want.squeeze()).unwrap();
            assert_eq!(
                d.log_prob.to_bits(),
                want.to_bits(),
                "vocab {vocab}, offset {offset}, row {i}: sampler {} vs trainer kernel {want}",
                d.log_prob
            );
        }
    }
}

/// The residual add with its RMSNorm (`add_rms_norm`) and rope_store's Qwen3 q/k norms give
/// ATen's bits: `x + delta` then `at::rms_norm`, the trainer's forward, for the real models' row
/// sizes and odd ones, bf16 and fp32.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_fused_norms_equal_aten() {
    require_gpu();
    use ooze_torch::kernels::{self, RopeStore};
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    let eps = 1e-6;
    let differing =
        |a: &Tensor, b: &Tensor| i64::try_from(a.ne_tensor(b).sum(Kind::Int64)).unwrap();
    for kind in [Kind::BFloat16, Kind::Float] {
        for n in [12i64, 64, 128, 896, 1536, 2560, 3584, 4096, 5120, 8192] {
            for rows in [1i64, 7, 256] {
                let x = Tensor::randn([rows, n], (kind, dev)) * 4.0;
                let delta = Tensor::randn([rows, n], (kind, dev)) * 0.5;
                let w = Tensor::randn([n], (kind, dev)) * 0.2 + 1.0;
                let (sum, out) = kernels::add_rms_norm(&x, &delta, &w, eps).unwrap();
                let want_sum = &x + &delta;
                let want = want_sum.rms_norm([n].as_slice(), Some(&w), eps);
                assert_eq!(differing(&sum, &want_sum), 0, "{kind:?} {rows}x{n}: sum");
                assert_eq!(differing(&out, &want), 0, "{kind:?} {rows}x{n}: add + norm");
                // A zero delta: the norm of x itself.
                let (_, alone) = kernels::add_rms_norm(&x, &x.zeros_like(), &w, eps).unwrap();
                let want = x.rms_norm([n].as_slice(), Some(&w), eps);
                assert_eq!(
                    differing(&alone, &want),
                    0,
                    "{kind:?} {rows}x{n}: norm alone"
                );
            }
        }
    }
    let x = Tensor::randn([3, 10], (Kind::BFloat16, dev));
    let w = Tensor::ones([10], (Kind::BFloat16, dev));
    let refused = kernels::add_rms_norm(&x, &x, &w, eps)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("multiple of 4"), "{refused}");

    for (kind, heads, kv_heads, dim) in [
        (Kind::BFloat16, 32, 8, 128),
        (Kind::BFloat16, 14, 2, 64),
        (Kind::BFloat16, 8, 2, 256),
        (Kind::BFloat16, 4, 2, 32),
        (Kind::Float, 16, 8, 128),
    ] {
        let rows = 37i64;
        let qkv = Tensor::randn([rows, (heads + 2 * kv_heads) * dim], (kind, dev)) * 3.0;
        let q_norm = Tensor::randn([dim], (kind, dev)) * 0.3 + 1.0;
        let k_norm = Tensor::randn([dim], (kind, dev)) * 0.3 + 1.0;
        let cos = Tensor::randn([rows, dim], (kind, dev));
        let sin = Tensor::randn([rows, dim], (kind, dev));
        let cells = Tensor::arange(rows, (Kind::Int64, dev)) * 3;
        let cache = || Tensor::zeros([rows * 3 / 16 + 1, 16, kv_heads, dim], (kind, dev));
        let args = |qk_norm| RopeStore {
            cos: &cos,
            signed_sin: &sin,
            heads,
            kv_heads,
            head_dim: dim,
            qk_norm,
        };
        let (mut k1, mut v1) = (cache(), cache());
        let q1 = kernels::rope_store(
            &qkv,
            &cells,
            &mut k1,
            &mut v1,
            &args(Some(kernels::QkNorm {
                q: &q_norm,
                k: &k_norm,
                eps,
            })),
        )
        .unwrap();
        // ATen's norms on the q and k heads, then the rotation alone.
        let part = |from: i64, n: i64| qkv.narrow(1, from * dim, n * dim).reshape([rows, n, dim]);
        let q = part(0, heads).rms_norm([dim].as_slice(), Some(&q_norm), eps);
        let k = part(heads, kv_heads).rms_norm([dim].as_slice(), Some(&k_norm), eps);
        let normed = Tensor::cat(
            &[
                q.view([rows, -1]),
                k.view([rows, -1]),
                qkv.narrow(1, (heads + kv_heads) * dim, kv_heads * dim),
            ],
            1,
        );
        let (mut k2, mut v2) = (cache(), cache());
        let q2 = kernels::rope_store(&normed, &cells, &mut k2, &mut v2, &args(None)).unwrap();
        let shape = format!("{kind:?} {heads}/{kv_heads} x {dim}");
        assert_eq!(differing(&q1, &q2), 0, "{shape}: q");
        assert_eq!(differing(&k1, &k2), 0, "{shape}: k");
        assert_eq!(differing(&v1, &v2), 0, "{shape}: v");
    }
}

/// The paged decode attention kernels (both arithmetics) against attention written out in fp32,
/// for key counts around the tile (16), split (256) and FlashAttention block (64/128) boundaries,
/// two head sizes and grouped queries.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_decode_attention_matches_reference() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    for (heads, kv_heads, dim) in [(14, 2, 64), (32, 8, 128), (4, 4, 64)] {
        let lengths: [i64; 10] = [1, 2, 15, 16, 17, 255, 256, 257, 700, 1024];
        let rows = lengths.len() as i64;
        let (slots_total, slot_len) = (rows + 3, 1024);
        let k_cache = Tensor::randn(
            [slots_total, slot_len, kv_heads, dim],
            (Kind::BFloat16, dev),
        );
        let v_cache = Tensor::randn(
            [slots_total, slot_len, kv_heads, dim],
            (Kind::BFloat16, dev),
        );
        let q = Tensor::randn([rows, heads, dim], (Kind::BFloat16, dev));
        // Rows use scattered slots (each one block of the whole length: block tables one wide);
        // position = keys - 1.
        let slot_ids: Vec<i64> = (0..rows).map(|r| (r * 5 + 2) % slots_total).collect();
        let slots = Tensor::from_slice(&slot_ids).to_device(dev).unsqueeze(1);
        let positions = Tensor::from_slice(&lengths.map(|n| n - 1)).to_device(dev);
        let scale = 1.0 / (dim as f64).sqrt();
        for arithmetic in [
            kernels::PagedArithmetic::FlashOrder,
            kernels::PagedArithmetic::Split,
        ] {
            let out = kernels::decode_attention(
                &q, &k_cache, &v_cache, &slots, &positions, 1024, scale, arithmetic,
            )
            .unwrap()
            .to_kind(Kind::Float);
            let group = heads / kv_heads;
            let mut worst = 0.0f64;
            for (r, (&n, &slot)) in lengths.iter().zip(&slot_ids).enumerate() {
                let k = k_cache.get(slot).narrow(0, 0, n).to_kind(Kind::Float); // [n, kv, d]
                let v = v_cache.get(slot).narrow(0, 0, n).to_kind(Kind::Float);
                for h in 0..heads {
                    let kv = h / group;
                    let qh = q.get(r as i64).get(h).to_kind(Kind::Float); // [d]
                    let scores = k.select(1, kv).mv(&qh) * scale; // [n]
                    let p = scores.softmax(0, Kind::Float);
                    let want = v.select(1, kv).tr().mv(&p); // [d]
                    let got = out.get(r as i64).get(h);
                    worst = worst.max((got - want).abs().max().double_value(&[]));
                }
            }
            assert!(
            worst < 2e-2,
            "{arithmetic:?}, heads {heads}/{kv_heads}, dim {dim}: max |kernel - reference| {worst}"
        );
            eprintln!(
                "decode attention {arithmetic:?} {heads}/{kv_heads}x{dim}: max |diff| {worst:.2e}"
            );
        }
    }
}

/// Decode attention with the rotary step folded in (`decode_attention_rope`) gives the bits of
/// `rope_store` then `decode_attention` in FlashAttention-2's order: the same outputs and the same
/// keys and values written into the paged memory. Paged rows of 16-key blocks in a shuffled
/// table; rows past one chunk (4,096 keys), a launch that reads fewer keys than its longest row,
/// and projection rows with padding between them.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_decode_attention_with_rope_equals_separate_kernels() {
    require_gpu();
    use ooze_torch::kernels::{self, PagedArithmetic, RopeStore};
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    let lengths: [i64; 9] = [1, 2, 17, 128, 129, 700, 4096, 4097, 5000];
    let rows = lengths.len() as i64;
    let width = (lengths.iter().max().unwrap() + 15) / 16;
    let blocks = rows * width + 5;
    // Row r's blocks: a shuffled slice of all of them.
    let order = Tensor::randperm(blocks, (Kind::Int64, Device::Cpu));
    let order: Vec<i64> = Vec::try_from(order).unwrap();
    let table: Vec<i64> = (0..rows * width).map(|i| order[i as usize]).collect();
    let tables = Tensor::from_slice(&table)
        .view([rows, width])
        .to_device(dev);
    let positions: Vec<i64> = lengths.iter().map(|n| n - 1).collect();
    let cells: Vec<i64> = positions
        .iter()
        .enumerate()
        .map(|(r, &p)| table[r * width as usize + (p / 16) as usize] * 16 + p % 16)
        .collect();
    let (positions, cells) = (
        Tensor::from_slice(&positions).to_device(dev),
        Tensor::from_slice(&cells).to_device(dev),
    );
    for (heads, kv_heads, dim) in [(14, 2, 64), (28, 4, 128), (4, 4, 64)] {
        let cache = || Tensor::randn([blocks, 16, kv_heads, dim], (Kind::BFloat16, dev));
        let (k0, v0) = (cache(), cache());
        let used = (heads + 2 * kv_heads) * dim;
        let qkv = (Tensor::randn([rows, used + 8], (Kind::BFloat16, dev)) * 2.0)
            .to_kind(Kind::BFloat16)
            .narrow(1, 0, used);
        let cos = Tensor::randn([rows, dim], (Kind::BFloat16, dev));
        let sin = Tensor::randn([rows, dim], (Kind::BFloat16, dev));
        let args = RopeStore {
            cos: &cos,
            signed_sin: &sin,
            heads,
            kv_heads,
            head_dim: dim,
            qk_norm: None,
        };
        let scale = 1.0 / (dim as f64).sqrt();
        for read_len in [5000, 4096] {
            let (mut k1, mut v1) = (k0.copy(), v0.copy());
            let q = kernels::rope_store(&qkv, &cells, &mut k1, &mut v1, &args).unwrap();
            let want = kernels::decode_attention(
                &q,
                &k1,
                &v1,
                &tables,
                &positions,
                read_len,
                scale,
                PagedArithmetic::FlashOrder,
            )
            .unwrap();
            let (mut k2, mut v2) = (k0.copy(), v0.copy());
            let got = kernels::decode_attention_rope(
                &qkv, &cells, &mut k2, &mut v2, &args, &tables, &positions, read_len, scale,
            )
            .unwrap();
            let what = format!("heads {heads}/{kv_heads} x {dim}, read_len {read_len}");
            let differing =
                |a: &Tensor, b: &Tensor| i64::try_from(a.ne_tensor(b).sum(Kind::Int64)).unwrap();
            assert_eq!(differing(&k1, &k2), 0, "{what}: keys written");
            assert_eq!(differing(&v1, &v2), 0, "{what}: values written");
            assert!(differing(&k1, &k0) > 0, "{what}: no key was written");
            assert_eq!(differing(&got, &want), 0, "{what}: attention outputs");
        }
    }
}

/// Decode attention in FlashAttention-2's order gives, for the last token of each sequence, the
/// bits FlashAttention-2's forward (what training runs) gives it over the whole sequence — up to
/// 4,096 keys — and the paged prefill kernel gives every token's; past that, rows are merged from
/// chunks and stay close.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_flash_order_attention_equals_flash_attention() {
    require_gpu();
    use ooze_torch::kernels::{self, PagedArithmetic};
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    for (heads, kv_heads, dim) in [(14, 2, 64), (32, 8, 128), (28, 4, 128)] {
        let lengths: Vec<i64> = vec![
            1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 700, 2048, 4096, 5000,
        ];
        let total: i64 = lengths.iter().sum();
        let q = Tensor::randn([total, heads, dim], (Kind::BFloat16, dev));
        let k = Tensor::randn([total, kv_heads, dim], (Kind::BFloat16, dev)) * 2.0;
        let k = k.to_kind(Kind::BFloat16);
        let v = Tensor::randn([total, kv_heads, dim], (Kind::BFloat16, dev));
        let mut offsets = vec![0i32];
        for &n in &lengths {
            offsets.push(offsets[offsets.len() - 1] + n as i32);
        }
        let cu = Tensor::from_slice(&offsets).to_device(dev);
        let longest = *lengths.iter().max().unwrap();
        let scale = 1.0 / (dim as f64).sqrt();
        let flash = kernels::flash_attention_varlen(&q, &k, &v, &cu, longest, scale).unwrap();
        // The same keys as paged memory: one block of 16 positions per cell run, the sequences'
        // blocks in order (block tables of consecutive blocks).
        let block = 16;
        let width = (longest + block - 1) / block;
        let rows = lengths.len() as i64;
        let k_cache = Tensor::zeros([rows * width, block, kv_heads, dim], (Kind::BFloat16, dev));
        let v_cache = Tensor::zeros([rows * width, block, kv_heads, dim], (Kind::BFloat16, dev));
        for (r, &n) in lengths.iter().enumerate() {
            let start = offsets[r] as i64;
            let cells = |x: &Tensor| x.view([rows * width * block, kv_heads, dim]);
            cells(&k_cache)
                .narrow(0, r as i64 * width * block, n)
                .copy_(&k.narrow(0, start, n));
            cells(&v_cache)
                .narrow(0, r as i64 * width * block, n)
                .copy_(&v.narrow(0, start, n));
        }
        let tables = (Tensor::arange(rows * width, (Kind::Int64, dev))).view([rows, width]);
        let last: Vec<i64> = offsets[1..].iter().map(|&o| o as i64 - 1).collect();
        let last = Tensor::from_slice(&last).to_device(dev);
        let positions =
            Tensor::from_slice(&lengths.iter().map(|n| n - 1).collect::<Vec<_>>()).to_device(dev);
        let decoded = kernels::decode_attention(
            &q.index_select(0, &last).contiguous(),
            &k_cache,
            &v_cache,
            &tables,
            &positions,
            longest,
            scale,
            PagedArithmetic::FlashOrder,
        )
        .unwrap();
        let past = vec![0i64; lengths.len()];
        // Every token of every row as a prefill (rows padded to the longest: q laid out row after
        // row, `longest` tokens each).
        let padded_q = Tensor::zeros([rows * longest, heads, dim], (Kind::BFloat16, dev));
        for (r, &n) in lengths.iter().enumerate() {
            padded_q
                .narrow(0, r as i64 * longest, n)
                .copy_(&q.narrow(0, offsets[r] as i64, n));
        }
        let prefilled = kernels::paged_prefill_attention(
            &padded_q,
            &k_cache,
            &v_cache,
            &tables,
            &past,
            &vec![longest; lengths.len()],
            scale,
            PagedArithmetic::FlashOrder,
        )
        .unwrap();
        for (r, &n) in lengths.iter().enumerate() {
            let want = flash.get(offsets[r + 1] as i64 - 1);
            let got = decoded.get(r as i64);
            let all_want = flash.narrow(0, offsets[r] as i64, n);
            let all_got = prefilled.narrow(0, r as i64 * longest, n);
            if n <= 4096 {
                assert!(
                    got.equal(&want),
                    "{heads}/{kv_heads}x{dim}, {n} keys: decode differs from FlashAttention-2"
                );
                assert!(
                    all_got.equal(&all_want),
                    "{heads}/{kv_heads}x{dim}, {n} keys: prefill differs from FlashAttention-2"
                );
            } else {
                let worst = (got.to_kind(Kind::Float) - want.to_kind(Kind::Float))
                    .abs()
                    .max()
                    .double_value(&[]);
                assert!(
                    worst < 2e-2,
                    "{heads}/{kv_heads}x{dim}, {n} keys: merged rows off by {worst}"
                );
            }
        }
        eprintln!("flash-order attention {heads}/{kv_heads}x{dim}: bitwise FlashAttention-2's up to 4,096 keys");
    }
}
