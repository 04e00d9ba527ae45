//! The trainer's kernels and fused nodes against the operations they replace, values and
//! gradients, and the master-weight AdamW against libtorch's.

use super::*;

/// Packed sequences through FlashAttention over variable lengths give the padded layout's
/// log-probs (bf16), and a training step runs backward through it.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_packed_flash_attention_matches_padded_and_trains() {
    require_gpu();
    use ooze_train::{Sample, Trainer, TrainerConfig};
    let dir = random_model(Family::Qwen2, Size::Small, 12);
    let decoder = Decoder::load(dir.path(), Device::Cuda(0), Kind::BFloat16).unwrap();
    let seqs = sequences(decoder.config.vocab_size);
    let score =
        |layout| score_sequences(&decoder, &seqs, layout, &ScoreOptions::default()).unwrap();
    let (packed, padded) = (score(Layout::Packed), score(Layout::Padded));
    let mut worst = 0.0f32;
    for (a, b) in packed.iter().zip(&padded) {
        for (x, y) in a.log_probs.iter().zip(&b.log_probs) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(
        worst < 0.1,
        "packed vs padded bf16 log-prob difference {worst}"
    );
    eprintln!("packed (flash varlen) vs padded: max |log-prob diff| {worst:.2e}");
    let samples: Vec<Sample> = seqs
        .iter()
        .map(|s| Sample::demonstration(s.clone(), vec![1; s.len() - 1]))
        .collect();
    let mut config = TrainerConfig::default();
    config.schedule.lr = 1e-3;
    let mut trainer = Trainer::new(decoder, None, config).unwrap();
    let first = trainer.sft_step(&samples).unwrap();
    for _ in 0..5 {
        trainer.sft_step(&samples).unwrap();
    }
    let last = trainer.sft_step(&samples).unwrap();
    assert!(
        first.grad_norm > 0.0 && last.loss < first.loss,
        "{} -> {}",
        first.loss,
        last.loss
    );
}

/// The kernels with a backward (silu·mul, rotary) against the libtorch operations they replace:
/// values and gradients, fp32.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_kernel_gradients_match_libtorch() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    let close = |a: &Tensor, b: &Tensor, what: &str| {
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{what}: max |diff| {diff}");
    };
    // silu·mul
    let mut x = Tensor::randn([37, 2 * 80], (Kind::Float, dev)).set_requires_grad(true);
    let w = Tensor::randn([37, 80], (Kind::Float, dev));
    let fused = kernels::silu_mul(&x).unwrap();
    (&fused * &w).sum(Kind::Float).backward();
    let g_fused = x.grad().copy();
    x.zero_grad();
    let plain = x.narrow(1, 0, 80).silu() * x.narrow(1, 80, 80);
    (&plain * &w).sum(Kind::Float).backward();
    close(&fused, &plain, "silu_mul value");
    close(&g_fused, &x.grad(), "silu_mul gradient");
    // rotary: 6 heads of 64 out of rows of 7 heads (the last one untouched, like v)
    let (tokens, heads, dim) = (29i64, 6i64, 64i64);
    let mut rows =
        Tensor::randn([tokens, (heads + 1) * dim], (Kind::Float, dev)).set_requires_grad(true);
    let (cos, sin) = rotary_tables(tokens, dim, Kind::Float);
    let w = Tensor::randn([tokens, heads, dim], (Kind::Float, dev));
    let fused = kernels::rope(
        &rows,
        &cos.view([tokens, dim]),
        &sin.view([tokens, dim]),
        heads,
        dim,
    )
    .unwrap();
    (&fused * &w).sum(Kind::Float).backward();
    let g_fused = rows.grad().copy();
    rows.zero_grad();
    let x = rows
        .narrow(1, 0, heads * dim)
        .view([1, tokens, heads, dim])
        .transpose(1, 2);
    let plain = ooze_model::rope::apply(&x, &cos, &sin)
        .transpose(1, 2)
        .reshape([tokens, heads, dim]);
    (&plain * &w).sum(Kind::Float).backward();
    close(&fused, &plain, "rope value");
    close(&g_fused, &rows.grad(), "rope gradient");
}

/// Rotary tables `[1, tokens, dim]` (cos, and the sine with its first half negated) of positions
/// 0, 37, 74, … at θ = 1e6, on the GPU in `kind`.
fn rotary_tables(
    tokens: i64,
    dim: i64,
    kind: Kind,
) -> (ooze_torch::tch::Tensor, ooze_torch::tch::Tensor) {
    use ooze_model::config::Rope;
    let dev = Device::Cuda(0);
    let inv = ooze_model::rope::inverse_frequencies(
        &Rope {
            theta: 1e6,
            llama3: None,
        },
        dim,
        dev,
    );
    let positions = ooze_torch::tch::Tensor::arange(tokens, (Kind::Int64, dev)).unsqueeze(0) * 37;
    ooze_model::rope::cos_sin(&inv, &positions, kind)
}

/// `x`'s values in a tensor whose data starts 4 bytes past a 16-byte boundary: ooze's elementwise
/// kernels then take their two-element (or one-element) paths instead of the 16-byte ones.
fn misaligned_copy(x: &ooze_torch::tch::Tensor) -> ooze_torch::tch::Tensor {
    let n = x.numel() as i64;
    let buffer = ooze_torch::tch::Tensor::zeros([n + 2], (x.kind(), x.device()));
    let view = buffer.narrow(0, 2, n).view(x.size().as_slice());
    view.detach().copy_(x);
    view
}

/// The bf16 kernels that read eight elements at a time (silu·mul and its backward, the rotary
/// embedding and its backward) give the bits of the narrower kernels they stand in for.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_wide_elementwise_kernels_equal_narrow_ones() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    let bf16 = (Kind::BFloat16, dev);
    for (rows, width) in [(1i64, 8i64), (37, 4864), (300, 9728)] {
        let x = Tensor::randn([rows, 2 * width], bf16) * 3.0;
        let up = Tensor::randn([rows, width], bf16);
        let mut results = Vec::new();
        for input in [x.copy(), misaligned_copy(&x)] {
            let leaf = input.detach().set_requires_grad(true);
            let y = kernels::silu_mul(&leaf).unwrap();
            (&y * &up).sum(Kind::Float).backward();
            results.push((y.detach(), leaf.grad()));
        }
        assert!(results[0].0.equal(&results[1].0), "silu_mul {rows}x{width}");
        assert!(
            results[0].1.equal(&results[1].1),
            "silu_mul backward {rows}x{width}"
        );
    }
    for (tokens, heads, dim) in [(29i64, 6i64, 64i64), (300, 48, 128)] {
        let rows = Tensor::randn([tokens, (heads + 2) * dim], bf16);
        let (cos, sin) = rotary_tables(tokens, dim, Kind::BFloat16);
        let (cos, sin) = (cos.view([tokens, dim]), sin.view([tokens, dim]));
        let wide = kernels::rope(&rows, &cos, &sin, heads, dim).unwrap();
        let narrow = kernels::rope(&misaligned_copy(&rows), &cos, &sin, heads, dim).unwrap();
        assert!(wide.equal(&narrow), "rope {tokens}x{heads}x{dim}");
        // The backward (sixteen-byte path: autograd's gradient is aligned) is the rotation by
        // the negated sine, which the narrow forward computes the same way.
        let leaf = rows.copy().set_requires_grad(true);
        let upstream = Tensor::randn([tokens, heads, dim], bf16);
        let y = kernels::rope(&leaf, &cos, &sin, heads, dim).unwrap();
        (&y * &upstream).sum(Kind::Float).backward();
        let back = kernels::rope(
            &misaligned_copy(&upstream.view([tokens, heads * dim])),
            &cos,
            &(-&sin),
            heads,
            dim,
        )
        .unwrap()
        .view([tokens, heads * dim]);
        let grad = leaf.grad();
        assert!(
            grad.narrow(1, 0, heads * dim).equal(&back),
            "rope backward {tokens}x{heads}x{dim}"
        );
        let rest = grad.narrow(1, heads * dim, 2 * dim);
        assert!(
            rest.eq(0.0).all().int64_value(&[]) == 1,
            "columns past the heads get no gradient"
        );
    }
}

/// Each (what, ours, ATen's, exact fp64) gradient: ours at most twice ATen's relative error (largest
/// absolute error over the largest exact value), plus 1e-3.
fn gradients_as_close_as_aten(
    label: &str,
    gradients: &[(
        &str,
        &ooze_torch::tch::Tensor,
        &ooze_torch::tch::Tensor,
        &ooze_torch::tch::Tensor,
    )],
) {
    let err = |a: &ooze_torch::tch::Tensor, exact: &ooze_torch::tch::Tensor| {
        (a.to_kind(Kind::Double) - exact)
            .abs()
            .max()
            .double_value(&[])
            / exact.abs().max().double_value(&[])
    };
    for (what, ours, aten, exact) in gradients {
        let (e_ours, e_aten) = (err(ours, exact), err(aten, exact));
        assert!(
            e_ours <= 2.0 * e_aten + 1e-3,
            "{label}, {what} gradient: relative error {e_ours:.2e}, ATen's {e_aten:.2e}"
        );
    }
}

/// Training's RMSNorm, alone and after the residual add: ATen's forward bit for bit, and a
/// backward at least as close to the exact gradient (fp64) as ATen's own bf16 backward, for the
/// inputs and the weight.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_trained_rms_norm_matches_aten() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    // 8,192 columns: the widest rows the backward takes (1,024 threads a block).
    for (rows, n) in [
        (1i64, 256i64),
        (33, 896),
        (4099, 2560),
        (517, 3584),
        (65, 8192),
    ] {
        let x = (Tensor::randn([rows, n], (Kind::Float, dev)) * 2.0).to_kind(Kind::BFloat16);
        let w = (Tensor::randn([n], (Kind::Float, dev)) * 0.3 + 1.0).to_kind(Kind::BFloat16);
        let up = Tensor::randn([rows, n], (Kind::BFloat16, dev));
        let run = |ours: bool, kind: Kind| {
            let x = x.to_kind(kind).detach().set_requires_grad(true);
            let w = w.to_kind(kind).detach().set_requires_grad(true);
            let y = if ours {
                kernels::rms_norm_trained(&x, &w, 1e-6).unwrap()
            } else {
                x.rms_norm([n].as_slice(), Some(&w), 1e-6)
            };
            (&y * up.to_kind(kind)).sum(kind).backward();
            (y.detach(), x.grad(), w.grad())
        };
        let (y_ours, dx_ours, dw_ours) = run(true, Kind::BFloat16);
        let (y_aten, dx_aten, dw_aten) = run(false, Kind::BFloat16);
        let (_, dx_exact, dw_exact) = run(false, Kind::Double);
        assert!(
            y_ours.equal(&y_aten),
            "forward {rows}x{n} differs from ATen's"
        );
        gradients_as_close_as_aten(
            &format!("{rows}x{n} norm"),
            &[
                ("input", &dx_ours, &dx_aten, &dx_exact),
                ("weight", &dw_ours, &dw_aten, &dw_exact),
            ],
        );
        // The residual add before the norm; both the sum and the normed rows feed the loss.
        let delta = Tensor::randn([rows, n], (Kind::BFloat16, dev));
        let up_sum = Tensor::randn([rows, n], (Kind::BFloat16, dev));
        let run_add = |ours: bool, kind: Kind| {
            let x = x.to_kind(kind).detach().set_requires_grad(true);
            let d = delta.to_kind(kind).detach().set_requires_grad(true);
            let w = w.to_kind(kind).detach().set_requires_grad(true);
            let (sum, y) = if ours {
                kernels::add_rms_norm_trained(&x, &d, &w, 1e-6).unwrap()
            } else {
                let sum = &x + &d;
                let y = sum.rms_norm([n].as_slice(), Some(&w), 1e-6);
                (sum, y)
            };
            ((&y * up.to_kind(kind)).sum(kind) + (&sum * up_sum.to_kind(kind)).sum(kind))
                .backward();
            (sum.detach(), y.detach(), x.grad(), d.grad(), w.grad())
        };
        let ours = run_add(true, Kind::BFloat16);
        let aten = run_add(false, Kind::BFloat16);
        let exact = run_add(false, Kind::Double);
        assert!(ours.0.equal(&aten.0), "residual sum {rows}x{n}");
        assert!(ours.1.equal(&aten.1), "add + norm forward {rows}x{n}");
        gradients_as_close_as_aten(
            &format!("{rows}x{n} add + norm"),
            &[
                ("x", &ours.2, &aten.2, &exact.2),
                ("delta", &ours.3, &aten.3, &exact.3),
                ("weight", &ours.4, &aten.4, &exact.4),
            ],
        );
    }
}

/// The fused head log-prob kernel against log_softmax written out: values, entropies and the
/// gradients with respect to the hidden states and the head, fp32, at temperature 0.7, over 37
/// rows in chunks of 16 (the last one short, the head's gradient accumulated across them).
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_linear_log_prob_matches_log_softmax() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    ooze_torch::tch::manual_seed(11);
    let mut hidden = Tensor::randn([37, 64], (Kind::Float, dev)).set_requires_grad(true);
    let mut weight = (Tensor::randn([3001, 64], (Kind::Float, dev)) * 0.3).set_requires_grad(true);
    let targets = Tensor::randint(3001, [37], (Kind::Int64, dev));
    let w = Tensor::randn([37], (Kind::Float, dev));
    let (lp, h) = kernels::linear_log_prob(
        &hidden,
        &weight,
        &targets,
        0.7,
        kernels::HeadLogits::Recompute,
        16,
    )
    .unwrap();
    (&lp * &w).sum(Kind::Float).backward();
    let (gh, gw) = (hidden.grad().copy(), weight.grad().copy());
    hidden.zero_grad();
    weight.zero_grad();
    let logp = (hidden.matmul(&weight.tr()) / 0.7).log_softmax(-1, Kind::Float);
    let plain = logp.gather(1, &targets.unsqueeze(1), false).squeeze_dim(1);
    let entropy = -(logp.exp() * &logp).sum_dim_intlist([-1i64].as_slice(), false, Kind::Float);
    (&plain * &w).sum(Kind::Float).backward();
    let close = |a: &Tensor, b: &Tensor, what: &str| {
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff < 2e-5, "{what}: max |diff| {diff}");
    };
    close(&lp, &plain, "log-prob");
    close(&h, &entropy.detach(), "entropy");
    close(&gh, &hidden.grad(), "d/dhidden");
    close(&gw, &weight.grad(), "d/dweight");

    // bf16: the backward from logits kept in bf16 (the logits' gradients written over them, one
    // product per gradient over all rows) against the one that recomputes them in fp32 chunk by
    // chunk, and both against the fp32 gradients above; and logits that are bf16 from the matmul
    // on: log-probs of the rounded logits, the kept logits' gradients.
    let grads = |mode: kernels::HeadLogits| {
        let mut h16 = hidden
            .detach()
            .to_kind(Kind::BFloat16)
            .set_requires_grad(true);
        let mut w16 = weight
            .detach()
            .to_kind(Kind::BFloat16)
            .set_requires_grad(true);
        let (lp, _) = kernels::linear_log_prob(&h16, &w16, &targets, 0.7, mode, 10).unwrap();
        (&lp * &w).sum(Kind::Float).backward();
        let g = (
            h16.grad().to_kind(Kind::Float),
            w16.grad().to_kind(Kind::Float),
        );
        h16.zero_grad();
        w16.zero_grad();
        (lp.detach(), g)
    };
    let (lp_keep, g_keep) = grads(kernels::HeadLogits::KeepRounded);
    let (lp_re, g_re) = grads(kernels::HeadLogits::Recompute);
    let (lp_bf16, g_bf16) = grads(kernels::HeadLogits::Bf16);
    assert!(
        lp_keep.equal(&lp_re),
        "the forward does not depend on keeping the logits"
    );
    // The bf16 logits' log-probs: log_softmax of the rounded logits, in fp32.
    let rounded = hidden
        .detach()
        .to_kind(Kind::BFloat16)
        .matmul(&weight.detach().to_kind(Kind::BFloat16).tr())
        .to_kind(Kind::Float);
    let want = (rounded / 0.7)
        .log_softmax(-1, Kind::Float)
        .gather(1, &targets.unsqueeze(1), false)
        .squeeze_dim(1);
    let diff = (&lp_bf16 - &want).abs().max().double_value(&[]);
    assert!(diff < 1e-4, "bf16 logits' log-probs: max |diff| {diff}");
    assert!(
        !lp_bf16.equal(&lp_keep),
        "bf16 logits round what fp32 logits keep"
    );
    // Relative in norm: single entries near zero carry bf16's rounding of the larger ones.
    let norm = |t: &Tensor| t.norm().double_value(&[]);
    let rel = |a: &Tensor, b: &Tensor| norm(&(a - b)) / norm(b);
    let (fp32_h, fp32_w) = (hidden.grad(), weight.grad());
    for (what, got, want) in [
        ("kept-logits d/dhidden vs recomputed", &g_keep.0, &g_re.0),
        ("kept-logits d/dweight vs recomputed", &g_keep.1, &g_re.1),
        ("kept-logits d/dhidden vs fp32", &g_keep.0, &fp32_h),
        ("kept-logits d/dweight vs fp32", &g_keep.1, &fp32_w),
        ("recomputed d/dweight vs fp32", &g_re.1, &fp32_w),
        ("bf16-logits d/dhidden vs kept", &g_bf16.0, &g_keep.0),
        ("bf16-logits d/dweight vs kept", &g_bf16.1, &g_keep.1),
        ("bf16-logits d/dhidden vs fp32", &g_bf16.0, &fp32_h),
    ] {
        // Both bf16 paths round the same inputs; against fp32 the inputs' rounding adds its own.
        let bound = if what.ends_with("fp32") { 2e-2 } else { 1e-2 };
        let r = rel(got, want);
        assert!(r < bound, "{what}: off by {r} (relative, in norm)");
    }
}

/// Training's fused attention step (Qwen3's q/k norms where the model has them, the rotary
/// embedding and FlashAttention-2 on the projection's output, one gradient for it) against the
/// separate operations it replaces (ATen's `rms_norm` over the heads, ooze's rotary kernel,
/// FlashAttention-2), on three packed sequences with 16 columns past the heads, for 14 query and
/// 2 key heads of 64 (Qwen2.5-0.5B) and 32 and 8 of 128 with norms (Qwen3-4B): the same output
/// bitwise (the engine's bits), the same gradients of the projection and the norm weights (up to
/// FlashAttention's atomic dq sums and the order of the weights' sums; zero past the heads).
/// The bf16 rotary rows (cos, signed sin) `[positions, head_dim]` of `positions`, θ = 1e6.
fn rotary_rows(
    positions: &[i64],
    head_dim: i64,
    dev: Device,
) -> (ooze_torch::tch::Tensor, ooze_torch::tch::Tensor) {
    use ooze_torch::tch::Tensor;
    let rope = ooze_model::config::Rope {
        theta: 1e6,
        llama3: None,
    };
    let inv_freq = ooze_model::rope::inverse_frequencies(&rope, head_dim, dev);
    let (cos, sin) = ooze_model::rope::cos_sin(
        &inv_freq,
        &Tensor::from_slice(positions).to_device(dev),
        Kind::BFloat16,
    );
    let rows = positions.len() as i64;
    (cos.view([rows, head_dim]), sin.view([rows, head_dim]))
}

#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_fused_qkv_attention_matches_separate_ops() {
    require_gpu();
    use ooze_torch::kernels;
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    let lengths = [37i64, 64, 5];
    let total: i64 = lengths.iter().sum();
    let positions: Vec<i64> = lengths.iter().flat_map(|&l| 0..l).collect();
    let offsets = Tensor::from_slice(&[0i32, 37, 101, 106]).to_device(dev);
    let relative = |a: &Tensor, b: &Tensor| -> f64 {
        let d = (a.to_kind(Kind::Float) - b.to_kind(Kind::Float)).norm();
        d.double_value(&[]) / b.to_kind(Kind::Float).norm().double_value(&[])
    };
    for (heads, kv, d, normed) in [(14i64, 2i64, 64i64, false), (32, 8, 128, true)] {
        ooze_torch::tch::manual_seed(5);
        let qkv = Tensor::randn([total, (heads + 2 * kv) * d + 16], (Kind::BFloat16, dev));
        let (cos, sin) = rotary_rows(&positions, d, dev);
        let upstream = Tensor::randn([total, heads, d], (Kind::BFloat16, dev));
        let norm_weight = || (Tensor::rand([d], (Kind::Float, dev)) + 0.5).to_kind(Kind::BFloat16);
        let (q_norm, k_norm) = (norm_weight(), norm_weight());
        let eps = 1e-6;
        let scale = 1.0 / (d as f64).sqrt();
        let run = |fused: bool| {
            let x = qkv.copy().set_requires_grad(true);
            let qn = q_norm.copy().set_requires_grad(normed);
            let kn = k_norm.copy().set_requires_grad(normed);
            let out = if fused {
                let norms = normed.then_some(kernels::QkNorm {
                    q: &qn,
                    k: &kn,
                    eps,
                });
                kernels::qkv_flash_attention_varlen(
                    &x, &cos, &sin, &offsets, norms, heads, kv, d, 64, scale, None,
                )
                .unwrap()
            } else {
                let qk = if normed {
                    let part = |from: i64, n: i64, w: &Tensor| {
                        x.narrow(1, from * d, n * d).view([total, n, d]).rms_norm(
                            [d].as_slice(),
                            Some(w),
                            eps,
                        )
                    };
                    let qk = Tensor::cat(&[part(0, heads, &qn), part(heads, kv, &kn)], 1);
                    kernels::rope(&qk.view([total, -1]), &cos, &sin, heads + kv, d).unwrap()
                } else {
                    kernels::rope(&x, &cos, &sin, heads + kv, d).unwrap()
                };
                let v = x.narrow(1, (heads + kv) * d, kv * d).view([total, kv, d]);
                kernels::flash_attention_varlen(
                    &qk.narrow(1, 0, heads),
                    &qk.narrow(1, heads, kv),
                    &v,
                    &offsets,
                    64,
                    scale,
                )
                .unwrap()
            };
            (&out * &upstream).sum(Kind::Float).backward();
            let norm_grads = normed.then(|| (qn.grad(), kn.grad()));
            (out.detach(), x.grad(), norm_grads)
        };
        let ((out_f, grad_f, norms_f), (out_s, grad_s, norms_s)) = (run(true), run(false));
        let shape = format!("{heads}/{kv}x{d}");
        assert!(out_f.equal(&out_s), "{shape}: the fused forward differs");
        let past = grad_f.narrow(1, (heads + 2 * kv) * d, 16);
        assert_eq!(
            past.abs().max().double_value(&[]),
            0.0,
            "{shape}: columns past the heads"
        );
        let e = relative(&grad_f, &grad_s);
        eprintln!("{shape}: the projection's gradient differs by {e:.2e} (relative)");
        assert!(
            e < 1e-2,
            "{shape}: the projection's gradient differs by {e:.3e}"
        );
        if let (Some((qf, kf)), Some((qs, ks))) = (norms_f, norms_s) {
            for (what, f, s) in [("q_norm", qf, qs), ("k_norm", kf, ks)] {
                let e = relative(&f, &s);
                eprintln!("{shape}: {what}'s gradient differs by {e:.2e} (relative)");
                assert!(e < 2e-2, "{shape}: {what}'s gradient differs by {e:.3e}");
            }
        }
    }
}

/// cuDNN's fused attention over slots (the trainer's default on Hopper) trains like
/// FlashAttention-2: outputs and gradients within bf16 rounding of FlashAttention-2's (and not its
/// bits: cuDNN ran), for slots that are views of the packed tensors and for slots filled by copies
/// (several groups, padding, sequences reordered), with and without Qwen3's q/k norms.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_slot_attention_trains_like_flash_attention() {
    require_gpu();
    use ooze_torch::kernels::{self, SlotLayout, SlotPlan};
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    if !kernels::slot_attention_usable(dev) {
        eprintln!("cuDNN's fused attention does not run on this GPU: nothing to compare");
        return;
    }
    let relative = |a: &Tensor, b: &Tensor| -> f64 {
        let d = (a.to_kind(Kind::Float) - b.to_kind(Kind::Float)).norm();
        d.double_value(&[]) / b.to_kind(Kind::Float).norm().double_value(&[])
    };
    let cases: [(&[i64], bool); 2] = [
        (&[512, 512, 256], true),
        (&[300, 1000, 64, 1, 129, 517, 1024], false),
    ];
    for (lengths, identity) in cases {
        let total: i64 = lengths.iter().sum();
        let positions: Vec<i64> = lengths.iter().flat_map(|&l| 0..l).collect();
        let mut offsets = vec![0i32];
        for &l in lengths {
            offsets.push(offsets[offsets.len() - 1] + l as i32);
        }
        let offsets = Tensor::from_slice(&offsets).to_device(dev);
        let longest = *lengths.iter().max().unwrap();
        let plan = SlotPlan::build(lengths).unwrap();
        assert_eq!(plan.identity, identity, "{lengths:?}");
        let slots = SlotLayout::from_plan(&plan, dev);
        for (heads, kv, d, normed) in [(14i64, 2i64, 64i64, false), (32, 8, 128, true)] {
            ooze_torch::tch::manual_seed(7);
            let qkv = Tensor::randn([total, (heads + 2 * kv) * d], (Kind::BFloat16, dev));
            let (cos, sin) = rotary_rows(&positions, d, dev);
            let upstream = Tensor::randn([total, heads, d], (Kind::BFloat16, dev));
            let q_norm = (Tensor::rand([d], (Kind::Float, dev)) + 0.5).to_kind(Kind::BFloat16);
            let k_norm = (Tensor::rand([d], (Kind::Float, dev)) + 0.5).to_kind(Kind::BFloat16);
            let run = |slots: Option<&SlotLayout>| {
                let x = qkv.copy().set_requires_grad(true);
                let qn = q_norm.copy().set_requires_grad(normed);
                let kn = k_norm.copy().set_requires_grad(normed);
                let norms = normed.then_some(kernels::QkNorm {
                    q: &qn,
                    k: &kn,
                    eps: 1e-6,
                });
                let scale = 1.0 / (d as f64).sqrt();
                let out = kernels::qkv_flash_attention_varlen(
                    &x, &cos, &sin, &offsets, norms, heads, kv, d, longest, scale, slots,
                )
                .unwrap();
                (&out * &upstream).sum(Kind::Float).backward();
                let norm_grad = normed.then(|| qn.grad());
                (out.detach(), x.grad(), norm_grad)
            };
            let (out_c, grad_c, norm_c) = run(Some(&slots));
            let (out_f, grad_f, norm_f) = run(None);
            let shape = format!("{lengths:?} {heads}/{kv}x{d}");
            assert!(!out_c.equal(&out_f), "{shape}: cuDNN did not run");
            let e_out = relative(&out_c, &out_f);
            let e_grad = relative(&grad_c, &grad_f);
            eprintln!("{shape}: output {e_out:.2e}, qkv gradient {e_grad:.2e} (relative)");
            assert!(e_out < 1e-2, "{shape}: outputs differ by {e_out:.3e}");
            assert!(e_grad < 2e-2, "{shape}: gradients differ by {e_grad:.3e}");
            // Every column of the gradient is finite (padding added nothing but zeros).
            assert_eq!(
                grad_c
                    .isfinite()
                    .logical_not()
                    .sum(Kind::Int64)
                    .int64_value(&[]),
                0
            );
            if let (Some(c), Some(f)) = (norm_c, norm_f) {
                let e = relative(&c, &f);
                assert!(e < 2e-2, "{shape}: q_norm's gradient differs by {e:.3e}");
            }
        }
    }
}

/// Split attention over packed sequences (deterministic training's forward) trains like
/// FlashAttention-2: the same outputs to bf16 rounding, and the same gradients, which
/// FlashAttention's backward takes from split attention's own output and log-sum-exp.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_split_attention_gradients_match_flash_attention() {
    require_gpu();
    use ooze_torch::kernels::{flash_attention_varlen, split_attention_varlen};
    use ooze_torch::tch::Tensor;
    let lengths = [300i64, 517, 64, 1, 129];
    let total: i64 = lengths.iter().sum();
    let mut offsets = vec![0i32];
    for &l in &lengths {
        offsets.push(offsets[offsets.len() - 1] + l as i32);
    }
    let device = Device::Cuda(0);
    let cu = Tensor::from_slice(&offsets).to_device(device);
    let relative = |a: &Tensor, b: &Tensor| -> f64 {
        let d = (a.to_kind(Kind::Float) - b.to_kind(Kind::Float)).norm();
        d.double_value(&[]) / b.to_kind(Kind::Float).norm().double_value(&[])
    };
    for (heads, kv_heads, dim) in [(14i64, 2i64, 64i64), (32, 8, 128)] {
        ooze_torch::tch::manual_seed(5);
        let leaf = |h: i64| {
            Tensor::randn([total, h, dim], (Kind::BFloat16, device)).set_requires_grad(true)
        };
        let (q, k, v) = (leaf(heads), leaf(kv_heads), leaf(kv_heads));
        let weight = Tensor::randn([total, heads, dim], (Kind::Float, device));
        let scale = 1.0 / (dim as f64).sqrt();
        let run = |split: bool| {
            for t in [&q, &k, &v] {
                let mut g = t.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let out = if split {
                split_attention_varlen(&q, &k, &v, &cu, &lengths, scale).unwrap()
            } else {
                flash_attention_varlen(&q, &k, &v, &cu, 517, scale).unwrap()
            };
            (out.to_kind(Kind::Float) * &weight)
                .sum(Kind::Float)
                .backward();
            (
                out.detach(),
                q.grad().copy(),
                k.grad().copy(),
                v.grad().copy(),
            )
        };
        let (out_s, dq_s, dk_s, dv_s) = run(true);
        let (out_f, dq_f, dk_f, dv_f) = run(false);
        let errors = [
            relative(&out_s, &out_f),
            relative(&dq_s, &dq_f),
            relative(&dk_s, &dk_f),
            relative(&dv_s, &dv_f),
        ];
        eprintln!(
            "split vs flash attention {heads}/{kv_heads}x{dim}: relative error of out, dq, dk, dv {:.2e} {:.2e} {:.2e} {:.2e}",
            errors[0], errors[1], errors[2], errors[3]
        );
        for (what, e) in ["out", "dq", "dk", "dv"].iter().zip(errors) {
            assert!(
                e < 1e-2,
                "{heads}/{kv_heads}x{dim}: {what} differs by {e:.3e} (relative)"
            );
        }
    }
}

/// The master-weight AdamW kernel (bf16 gradients read once, fp32 masters and moments, the bf16
/// weight written back) against libtorch's fused AdamW on upcast gradients followed by the copy
/// down: parameters of odd sizes (tails), more than one chunk, and one not 16-byte aligned (a view
/// one element in), two weight decays, a clipping divisor, three steps. The masters and moments
/// agree to fp32 rounding; the model weights are the masters rounded to bf16, bitwise.
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_master_adamw_matches_fused_adamw() {
    require_gpu();
    use ooze_torch::optim::{fused_adamw, master_adamw, AdamW, MasterSlot};
    use ooze_torch::tch::Tensor;
    let dev = Device::Cuda(0);
    ooze_torch::tch::manual_seed(11);
    let sizes = [7i64, 4096 + 3, 200_001, 64];
    let hyper = AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.98,
        weight_decay: 0.1,
        eps: 1e-8,
    };
    let f32 = (Kind::Float, dev);
    let masters: Vec<Tensor> = sizes.iter().map(|&n| Tensor::randn([n], f32)).collect();
    let decays = [0.1, 0.0, 0.1, 0.0];
    let state = |n: i64| {
        (
            Tensor::zeros([n], f32),
            Tensor::zeros([n], f32),
            Tensor::zeros([], f32),
        )
    };
    // The kernel's last master a view one element into its storage: not 16-byte aligned.
    let placed = |i: usize, m: &Tensor| {
        let n = m.numel() as i64;
        let mut view = if i == 3 {
            Tensor::zeros([n + 1], f32).narrow(0, 1, n)
        } else {
            Tensor::zeros([n], f32)
        };
        view.copy_(m);
        view
    };
    let mine: Vec<_> = masters
        .iter()
        .enumerate()
        .map(|(i, m)| (placed(i, m), state(m.numel() as i64)))
        .collect();
    let theirs: Vec<_> = masters
        .iter()
        .map(|m| (m.copy(), state(m.numel() as i64)))
        .collect();
    let models: Vec<Tensor> = masters.iter().map(|m| m.to_kind(Kind::BFloat16)).collect();
    let random_grads = || -> Vec<Tensor> {
        sizes
            .iter()
            .map(|&n| Tensor::randn([n], (Kind::BFloat16, dev)))
            .collect()
    };
    // Each parameter's slot for the kernel, over its state in `mine`.
    type State = (Tensor, (Tensor, Tensor, Tensor));
    fn slots_over<'a>(
        grads: &'a [Tensor],
        models: &'a [Tensor],
        mine: &'a [State],
        decays: &[f64],
    ) -> Vec<MasterSlot<'a>> {
        (0..grads.len())
            .map(|i| MasterSlot {
                grad: &grads[i],
                model: &models[i],
                master: &mine[i].0,
                exp_avg: &mine[i].1 .0,
                exp_avg_sq: &mine[i].1 .1,
                step: &mine[i].1 .2,
                weight_decay: decays[i],
            })
            .collect()
    }
    let divisor = Tensor::from_slice(&[1.7f32]).to_device(dev).view([]);
    for _ in 0..3 {
        let grads = random_grads();
        let slots = slots_over(&grads, &models, &mine, &decays);
        master_adamw(&slots, hyper, &divisor).unwrap();
        for (i, (p, (m, v, s))) in theirs.iter().enumerate() {
            fused_adamw(
                &mut [p.shallow_clone()],
                &[grads[i].to_kind(Kind::Float)],
                &mut [m.shallow_clone()],
                &mut [v.shallow_clone()],
                &mut [s.shallow_clone()],
                AdamW {
                    weight_decay: decays[i],
                    ..hyper
                },
                Some(&divisor),
            )
            .unwrap();
        }
    }
    for i in 0..sizes.len() {
        let ((p, (m, v, s)), (tp, (tm, tv, ts))) = (&mine[i], &theirs[i]);
        for (what, a, b) in [("master", p, tp), ("exp_avg", m, tm), ("exp_avg_sq", v, tv)] {
            assert!(
                a.allclose(b, 1e-5, 1e-7, false),
                "parameter {i}: {what} differs by {}",
                (a - b).abs().max().double_value(&[])
            );
        }
        assert_eq!(s.double_value(&[]), 3.0);
        assert_eq!(ts.double_value(&[]), 3.0);
        assert!(
            models[i].equal(&p.to_kind(Kind::BFloat16)),
            "parameter {i}: the model weight is not its master in bf16"
        );
    }
    // A non-finite divisor (a non-finite gradient norm) skips the step on the device: masters,
    // moments, step counters and model weights stay as they were, bit for bit.
    for bad in [f32::NAN, f32::INFINITY] {
        let before: Vec<Vec<Tensor>> = (0..sizes.len())
            .map(|i| {
                let (p, (m, v, s)) = &mine[i];
                vec![p.copy(), m.copy(), v.copy(), s.copy(), models[i].copy()]
            })
            .collect();
        let grads = random_grads();
        let slots = slots_over(&grads, &models, &mine, &decays);
        let divisor = Tensor::from_slice(&[bad]).to_device(dev).view([]);
        master_adamw(&slots, hyper, &divisor).unwrap();
        for (i, was) in before.iter().enumerate() {
            let (p, (m, v, s)) = &mine[i];
            for (what, now, then) in [
                ("master", p, &was[0]),
                ("exp_avg", m, &was[1]),
                ("exp_avg_sq", v, &was[2]),
                ("step", s, &was[3]),
                ("model", &models[i], &was[4]),
            ] {
                assert!(
                    now.equal(then),
                    "divisor {bad}, parameter {i}: {what} changed"
                );
            }
        }
    }
}

/// The optimizer's GPU step (bf16 weights with fp32 masters: ooze's AdamW kernel) on a non-finite
/// gradient, with and without clipping: an error naming the norm, and nothing moves — the weights
/// stay, and the next finite step gives, bitwise, a fresh optimizer's first step (no moment and no
/// step counter advanced).
#[test]
#[ignore = "needs a GPU: run with --ignored on a CUDA machine"]
fn gpu_optimizer_skips_a_non_finite_step() {
    require_gpu();
    use ooze_torch::tch::Tensor;
    use ooze_train::optimizer::Optimizer;
    use ooze_train::{OptimizerConfig, TrainError};
    let dev = Device::Cuda(0);
    ooze_torch::tch::manual_seed(5);
    let init = [
        Tensor::randn([64, 32], (Kind::Float, dev)).to_kind(Kind::BFloat16),
        Tensor::randn([4099], (Kind::Float, dev)).to_kind(Kind::BFloat16),
    ];
    // The gradient of Σ w·c is c: (i + 0.5) everywhere, one NaN in the second tensor if poisoned.
    let backward = |params: &[Tensor], poisoned: bool| {
        let mut terms = Vec::new();
        for (i, p) in params.iter().enumerate() {
            let c = Tensor::ones(p.size(), (Kind::Float, dev)) * (i as f64 + 0.5);
            if poisoned && i == 1 {
                let _ = c.get(7).fill_(f64::NAN);
            }
            terms.push((p.to_kind(Kind::Float) * c).sum(Kind::Float));
        }
        Tensor::stack(&terms, 0).sum(Kind::Float).backward();
    };
    for clip_grad in [1.0, 0.0] {
        let config = OptimizerConfig {
            clip_grad,
            weight_decay: 0.1,
            ..Default::default()
        };
        let fresh = || {
            let params: Vec<Tensor> = init.iter().map(|t| t.copy()).collect();
            let named = (params.iter().enumerate())
                .map(|(i, p)| (format!("p{i}"), p.shallow_clone()))
                .collect();
            (params, Optimizer::new(named, config.clone()))
        };
        let (params, mut skipped) = fresh();
        backward(&params, true);
        match skipped.step(1e-2, None) {
            Err(TrainError::NonFinite(message)) => {
                assert!(message.contains("gradient norm"), "{message}")
            }
            other => panic!("clip {clip_grad}: a NaN gradient gave {other:?}"),
        }
        for (p, was) in params.iter().zip(&init) {
            assert!(
                p.equal(was),
                "clip {clip_grad}: a skipped step moved a weight"
            );
        }
        skipped.zero_grad();
        backward(&params, false);
        skipped.step(1e-2, None).unwrap();
        let (first, mut clean) = fresh();
        backward(&first, false);
        clean.step(1e-2, None).unwrap();
        for ((a, b), was) in params.iter().zip(&first).zip(&init) {
            assert!(
                !a.equal(was),
                "clip {clip_grad}: the finite step moved nothing"
            );
            assert!(
                a.equal(b),
                "clip {clip_grad}: the step after a skipped one differs from a first step"
            );
        }
    }
}
