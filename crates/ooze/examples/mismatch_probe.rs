//! Where the engine's decode drifts from the trainer's forward, layer by layer (GPU diagnostic).
//!
//! `cargo run --release -p ooze --example mismatch_probe -- MODEL_DIR [batch] [prompt] [decoded]`
//! (a bf16 model on the first GPU; `PROBE_ONLY=text` runs only the variants whose name has it,
//! `PROBE_OPS=1` checks instead whether each GEMM and norm gives a few rows bitwise what it gives
//! them in a large batch). Random tokens; the reference is the
//! full-sequence forward (Causal, as scoring runs it, one block at a time); the engine side is a
//! paged prefill of the prompt, then one token per step as the engine decodes. Per block it prints
//! the relative L2 error of the decoded positions' residual stream, propagated (the engine's own
//! inputs) and local (the reference's inputs fed into that one block), and the share of elements
//! that differ at all; then the log-prob error of the next tokens.
use ooze_model::scoring::head_log_probs;
use ooze_model::{Attention, Decoder, PagedKv, ScoreOptions};
use ooze_torch::cuda_graph::{set_gemm_reduction, GemmReduction};
use ooze_torch::kernels;
use ooze_torch::tch::{self, Device, Kind, Tensor};

fn rel(a: &Tensor, b: &Tensor) -> (f64, f64) {
    let a = a.to_kind(Kind::Float);
    let b = b.to_kind(Kind::Float);
    let err = (&a - &b).norm().double_value(&[]) / b.norm().double_value(&[]).max(1e-30);
    let differ = a
        .ne_tensor(&b)
        .to_kind(Kind::Float)
        .mean(Kind::Float)
        .double_value(&[]);
    (err, differ)
}

struct Probe {
    dec: Decoder,
    ids: Tensor,
    b: i64,
    p: i64,
    g: i64,
}

impl Probe {
    fn tables(&self) -> (PagedKv, Vec<Vec<i64>>) {
        let bs = 16;
        let w = (self.p + self.g + bs - 1) / bs;
        let cache = PagedKv::new(
            &self.dec.config,
            self.b * w,
            bs,
            self.dec.device(),
            self.dec.kind(),
        );
        let tables = (0..self.b)
            .map(|r| (r * w..(r + 1) * w).collect())
            .collect();
        (cache, tables)
    }

    fn positions(&self, from: i64, len: i64) -> Tensor {
        Tensor::arange_start(from, from + len, (Kind::Int64, self.dec.device()))
            .unsqueeze(0)
            .expand([self.b, len], false)
    }

    /// Residual stream after each block, full sequence: `[L + 1]` tensors `[B, P + G, H]`.
    fn reference(&self, grad: bool) -> Vec<Tensor> {
        let n = self.p + self.g;
        let pos = self.positions(0, n);
        let mut xs = vec![self.dec.embed(&self.ids)];
        if grad {
            xs[0] = xs[0].detach().set_requires_grad(true);
        }
        for i in 0..self.dec.num_layers() {
            // run_layers adds into its input in place without autograd: give it a copy.
            let x = self
                .dec
                .run_layers(xs[i].copy(), i..i + 1, &pos, Attention::Causal);
            xs.push(x);
        }
        xs.into_iter().map(|x| x.detach()).collect()
    }

    /// Engine side, propagated: per block `[B, G, H]` of the decoded positions.
    fn engine(&self) -> Vec<Tensor> {
        let (mut cache, tables) = self.tables();
        let t: Vec<&[i64]> = tables.iter().map(|t| t.as_slice()).collect();
        let zero = vec![0i64; self.b as usize];
        let prompt = self.ids.narrow(1, 0, self.p);
        let _ = self.dec.hidden_states(
            &prompt,
            &self.positions(0, self.p),
            Attention::Paged {
                cache: &mut cache,
                tables: &t,
                past: &zero,
            },
        );
        let mut per_layer: Vec<Vec<Tensor>> =
            (0..=self.dec.num_layers()).map(|_| Vec::new()).collect();
        for s in 0..self.g {
            let at = self.p + s;
            let past = vec![at; self.b as usize];
            let mut x = self.dec.embed(&self.ids.narrow(1, at, 1));
            per_layer[0].push(x.copy());
            for i in 0..self.dec.num_layers() {
                x = self.dec.run_layers(
                    x,
                    i..i + 1,
                    &self.positions(at, 1),
                    Attention::Paged {
                        cache: &mut cache,
                        tables: &t,
                        past: &past,
                    },
                );
                per_layer[i + 1].push(x.copy());
            }
        }
        per_layer.into_iter().map(|v| Tensor::cat(&v, 1)).collect()
    }

    /// Engine side, local: block `i` fed the reference's input (prefill and every decode step).
    fn local(&self, xs: &[Tensor]) -> Vec<Tensor> {
        let (mut cache, tables) = self.tables();
        let t: Vec<&[i64]> = tables.iter().map(|t| t.as_slice()).collect();
        let zero = vec![0i64; self.b as usize];
        let mut out = vec![xs[0].narrow(1, self.p, self.g)];
        for (i, input) in xs.iter().enumerate().take(self.dec.num_layers()) {
            let _ = self.dec.run_layers(
                input.narrow(1, 0, self.p).copy(),
                i..i + 1,
                &self.positions(0, self.p),
                Attention::Paged {
                    cache: &mut cache,
                    tables: &t,
                    past: &zero,
                },
            );
            let mut steps = Vec::new();
            for s in 0..self.g {
                let at = self.p + s;
                let past = vec![at; self.b as usize];
                steps.push(self.dec.run_layers(
                    input.narrow(1, at, 1).copy(),
                    i..i + 1,
                    &self.positions(at, 1),
                    Attention::Paged {
                        cache: &mut cache,
                        tables: &t,
                        past: &past,
                    },
                ));
            }
            out.push(Tensor::cat(&steps, 1));
        }
        out
    }

    /// Next-token log-probs of the decoded positions from final hidden `[B, G, H]`: the engine's
    /// head (fp32 logits from the matmul, log-softmax) and the scoring head.
    fn log_probs(&self, hidden: &Tensor) -> (Tensor, Tensor) {
        let h = self
            .dec
            .final_norm(hidden)
            .view([-1, self.dec.config.hidden_size]);
        let targets = self.ids.narrow(1, self.p + 1, self.g - 1);
        let h = h
            .view([self.b, self.g, -1])
            .narrow(1, 0, self.g - 1)
            .reshape([-1, h.size()[1]]);
        let targets = targets.reshape([-1]);
        let logits = self.dec.logits_f32(&h);
        let engine = if kernels::deterministic() {
            kernels::log_probs(&logits, &targets, 1.0).expect("log-probs")
        } else {
            logits
                .log_softmax(-1, Kind::Float)
                .gather(1, &targets.unsqueeze(1), false)
                .squeeze_dim(1)
        };
        let (scoring, _) = head_log_probs(&self.dec, &h, &targets, &ScoreOptions::default());
        (engine, scoring)
    }
}

fn stats(d: &Tensor) -> String {
    let d = d.abs();
    format!(
        "mean {:.2e} max {:.2e}",
        d.mean(Kind::Float).double_value(&[]),
        d.max().double_value(&[])
    )
}

/// Whether an operation on a few rows gives bitwise what it gives on those rows of a large batch.
fn ops_check(dec: &Decoder) {
    let _g = tch::no_grad_guard();
    let dev = dec.device();
    let params = dec.trainable_parameters();
    let mut mats: Vec<(String, Tensor)> = params
        .iter()
        .filter(|(n, t)| n.starts_with("model.layers.0.") && t.dim() == 2)
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    mats.push(("head".into(), dec.head_weight().shallow_clone()));
    // The 4B (Qwen3) and 7B (Qwen2.5) shapes, random.
    for (name, out, inp) in [
        ("4b qkv", 6144, 2560),
        ("4b o", 2560, 4096),
        ("4b gate_up", 19456, 2560),
        ("4b down", 2560, 9728),
        ("7b qkv", 4608, 3584),
        ("7b o", 3584, 3584),
        ("7b gate_up", 37888, 3584),
        ("7b down", 3584, 18944),
    ] {
        mats.push((
            name.into(),
            Tensor::randn([out, inp], (Kind::BFloat16, dev)) * 0.02,
        ));
    }
    let rows = [1i64, 2, 8, 64, 1024];
    for (name, w) in &mats {
        let inner = w.size()[1];
        let x = Tensor::randn([4608, inner], (Kind::BFloat16, dev));
        let full = x.linear::<Tensor>(w, None);
        let base = Tensor::randn([4608, w.size()[0]], (Kind::BFloat16, dev));
        let mut full_add = base.copy();
        let _ = full_add.addmm_(&x, &w.tr());
        let mut line = format!("{name} {:?}:", w.size());
        for &m in &rows {
            let part = x.narrow(0, 0, m).linear::<Tensor>(w, None);
            let (_, d) = rel(&part, &full.narrow(0, 0, m));
            let mut part_add = base.narrow(0, 0, m).copy();
            let _ = part_add.addmm_(&x.narrow(0, 0, m), &w.tr());
            let (_, da) = rel(&part_add, &full_add.narrow(0, 0, m));
            line += &format!(" m={m} {d:.3}/{da:.3}");
        }
        println!("{line}");
    }
    // The head with fp32 output (the engine's logits), and the head as the trainer's log-prob kernel reads it.
    {
        let w = dec.head_weight();
        let x = Tensor::randn([4608, w.size()[1]], (Kind::BFloat16, dev));
        let full = x.mm_dtype(&w.tr(), Kind::Float);
        let mut line = "head fp32 out:".to_string();
        for &m in &[1i64, 2, 3, 8, 64] {
            let part = x.narrow(0, 0, m).mm_dtype(&w.tr(), Kind::Float);
            line += &format!(" m={m} {:.4}", rel(&part, &full.narrow(0, 0, m)).1);
        }
        println!("{line}");
    }
    let h = dec.config.hidden_size;
    let x = Tensor::randn([4608, h], (Kind::BFloat16, dev));
    let wn =
        Tensor::ones([h], (Kind::BFloat16, dev)) + Tensor::randn([h], (Kind::BFloat16, dev)) * 0.1;
    let full = x.rms_norm([h].as_slice(), Some(&wn), 1e-6);
    let mut line = "rms_norm:".to_string();
    for &m in &rows {
        let part = x.narrow(0, 0, m).rms_norm([h].as_slice(), Some(&wn), 1e-6);
        line += &format!(" m={m} {:.3}", rel(&part, &full.narrow(0, 0, m)).1);
    }
    println!("{line}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(&args[1]);
    let num = |i: usize, d: i64| args.get(i).map_or(d, |s| s.parse().expect("a number"));
    let (b, p, g) = (num(2, 8), num(3, 512), num(4, 64));
    let dec = Decoder::load(&dir, Device::Cuda(0), Kind::BFloat16).expect("model loads");
    tch::manual_seed(7);
    let ids = Tensor::randint(
        dec.config.vocab_size,
        [b, p + g],
        (Kind::Int64, Device::Cuda(0)),
    );
    let probe = Probe { dec, ids, b, p, g };
    let variants: Vec<(&str, bool, GemmReduction)> = vec![
        ("deterministic", true, GemmReduction::NoSplit),
        (
            "kernels, reduced-precision split-K (PyTorch's default)",
            true,
            GemmReduction::ReducedPrecision,
        ),
        (
            "kernels, no split-K (ooze's default)",
            true,
            GemmReduction::NoSplit,
        ),
        (
            "libtorch, reduced-precision split-K",
            false,
            GemmReduction::ReducedPrecision,
        ),
        ("libtorch, no split-K", false, GemmReduction::NoSplit),
    ];
    if std::env::var("PROBE_OPS").is_ok() {
        for mode in [GemmReduction::ReducedPrecision, GemmReduction::NoSplit] {
            set_gemm_reduction(mode).expect("setting");
            println!("== ops, {mode:?} (share of elements that differ: linear / addmm)");
            ops_check(&probe.dec);
        }
        return;
    }
    let only = std::env::var("PROBE_ONLY").ok();
    for (name, on, reduction) in variants {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        kernels::set_enabled(on);
        kernels::set_deterministic(name == "deterministic").expect("setting");
        set_gemm_reduction(reduction).expect("setting");
        let xs = {
            let _g = tch::no_grad_guard();
            probe.reference(false)
        };
        let xs_grad = probe.reference(true);
        if name == "deterministic" {
            // The backward of the deterministic forward runs (FlashAttention-2's backward).
            let n = probe.p + probe.g;
            let pos = probe.positions(0, n);
            let x0 = probe.dec.embed(&probe.ids).detach().set_requires_grad(true);
            let out = probe.dec.run_layers(
                x0.shallow_clone(),
                0..probe.dec.num_layers(),
                &pos,
                Attention::Causal,
            );
            out.to_kind(Kind::Float)
                .square()
                .mean(Kind::Float)
                .backward();
            let g = x0.grad();
            println!(
                "backward: grad norm {:.3e}, finite {}",
                g.to_kind(Kind::Float).norm().double_value(&[]),
                g.isfinite().all().int64_value(&[]) == 1
            );
        }
        let _g = tch::no_grad_guard();
        let eng = probe.engine();
        let loc = probe.local(&xs);
        println!("== {name}");
        println!("block  propagated(rel, differ)   local(rel, differ)   grad-vs-nograd ref(rel)");
        let l = probe.dec.num_layers();
        for i in 1..=l {
            let r = xs[i].narrow(1, p, g);
            let (pe, pd) = rel(&eng[i], &r);
            let (le, ld) = rel(&loc[i], &r);
            let (ge, _) = rel(&xs_grad[i].narrow(1, p, g), &r);
            if i <= 3 || i % 4 == 0 || i == l {
                println!("{i:>5}  {pe:.2e} {pd:.3}            {le:.2e} {ld:.3}          {ge:.2e}");
            }
        }
        let r = xs[l].narrow(1, p, g).contiguous();
        let (ref_engine_head, ref_scoring) = probe.log_probs(&r);
        let (eng_engine_head, _) = probe.log_probs(&eng[l].contiguous());
        let (grad_engine_head, grad_scoring) =
            probe.log_probs(&xs_grad[l].narrow(1, p, g).contiguous());
        for (what, a, b) in [
            (
                "engine vs scoring (as measured)",
                &eng_engine_head,
                &ref_scoring,
            ),
            (
                "heads alone on the reference hidden",
                &ref_engine_head,
                &ref_scoring,
            ),
            (
                "hidden alone (engine head on both)",
                &eng_engine_head,
                &ref_engine_head,
            ),
            (
                "engine vs grad-mode trainer",
                &eng_engine_head,
                &grad_scoring,
            ),
            (
                "grad-mode vs no-grad reference (engine head)",
                &grad_engine_head,
                &ref_engine_head,
            ),
        ] {
            println!("log-prob, {what}: {}", stats(&(a - b)));
        }
        println!(
            "mean |log-prob| {:.2}",
            ref_scoring.abs().mean(Kind::Float).double_value(&[])
        );
    }
}
