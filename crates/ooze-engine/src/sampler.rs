//! Token selection and the log-prob the trainer will see.
//!
//! Log-prob (one definition everywhere): `log_softmax(logits / T)` at the chosen token, before any
//! top-k / top-p / min-p truncation and before banning stop tokens under `min_new_tokens`; greedy
//! requests use T = 1, and no T is below [`crate::params::MIN_TEMPERATURE`]
//! ([`Sampling::log_prob_temperature`]), so the log-probs are finite. Sampling draws by inverse CDF over the truncated distribution with a uniform
//! number that depends only on the request's seed and the step, so a request's tokens depend only
//! on its seed and the logits — never on what else shares the batch.

use crate::params::Sampling;
use ooze_torch::kernels;
use ooze_torch::tch::{Kind, Tensor};
use ooze_torch::transfer::{upload, Download};

/// One row's sampling state for this step.
pub struct RowSampling<'a> {
    pub params: &'a Sampling,
    pub seed: u64,
    /// Index of the token being drawn within the request's output.
    pub step: u64,
    /// Token ids that must not be drawn now (stop tokens before `min_new_tokens`).
    pub banned: &'a [u32],
}

/// A drawn token and its log-prob.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub token: u32,
    pub log_prob: f32,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) for (seed, step): counter-based, so no generator state is shared.
pub fn uniform(seed: u64, step: u64) -> f64 {
    (mix(seed ^ mix(step)) >> 11) as f64 / (1u64 << 53) as f64
}

/// Draws one token per row of `logits [B, V]` (fp32, any device), all rows at once: a handful of
/// batched kernels per step whatever the batch size, and a full-vocabulary sort only when some row
/// asks for top-k or top-p.
pub fn draw(logits: &Tensor, rows: &[RowSampling<'_>]) -> Vec<Draw> {
    draw_async(logits, rows).wait()
}

/// Draws on their way to the host: the tokens are already on the logits' device, where the next
/// decode step reads them as its input, while the host gets tokens and log-probs from
/// [`PendingDraws::wait`].
pub struct PendingDraws {
    /// Row `i`'s token, int64 `[B]` on the logits' device.
    pub tokens: Tensor,
    both: Download,
}

impl PendingDraws {
    /// Each row's token and log-prob, once the GPU has drawn them.
    pub fn wait(self) -> Vec<Draw> {
        host_draws(&self.both.wait())
    }
}

/// [`draw`] without waiting: the kernels are queued and their results start on their way to the
/// host. Every upload is non-blocking, so the host returns without waiting for the GPU.
pub fn draw_async(logits: &Tensor, rows: &[RowSampling<'_>]) -> PendingDraws {
    let both = draw_tokens(logits, rows);
    // The sampling kernel's log-probs already are the trainer's.
    if kernels::deterministic()
        && !sampling_kernel_draws(logits, rows)
        && logits.device().is_cuda()
        && kernels::available()
    {
        trainer_log_probs(logits, rows, &both);
    }
    PendingDraws {
        tokens: both.get(0).to_kind(Kind::Int64),
        both: Download::start(&both),
    }
}

/// Deterministic numerics: replaces each draw's log-prob (row 1 of `both`, `[2, B]` tokens and
/// log-probs) with the trainer's kernel's, from the same fp32 logits (one call per distinct
/// temperature), so it equals the trainer's bitwise.
fn trainer_log_probs(logits: &Tensor, rows: &[RowSampling<'_>], both: &Tensor) {
    let device = logits.device();
    let mut temperatures: Vec<f64> = rows
        .iter()
        .map(|r| r.params.log_prob_temperature())
        .collect();
    temperatures.sort_by(f64::total_cmp);
    temperatures.dedup();
    let tokens = both.get(0).to_kind(Kind::Int64);
    for t in temperatures {
        let which: Vec<i64> = (0..rows.len())
            .filter(|&i| rows[i].params.log_prob_temperature() == t)
            .map(|i| i as i64)
            .collect();
        let index = upload(&which, device);
        let chosen = kernels::log_probs(
            &logits.index_select(0, &index),
            &tokens.index_select(0, &index),
            t,
        )
        .expect("invariant: fp32 logits rows and their tokens on one GPU are valid");
        let _ = both
            .get(1)
            .index_copy_(0, &index, &chosen.to_kind(Kind::Double));
    }
}

/// Whether [`draw_tokens`] draws these rows with ooze's sampling kernel ([`draw_fused`]).
fn sampling_kernel_draws(logits: &Tensor, rows: &[RowSampling<'_>]) -> bool {
    logits.device().is_cuda() && kernels::available() && rows.iter().all(RowSampling::is_plain)
}

/// Each row's token and its log-prob, `[2, B]` float64 on the logits' device.
fn draw_tokens(logits: &Tensor, rows: &[RowSampling<'_>]) -> Tensor {
    let device = logits.device();
    if sampling_kernel_draws(logits, rows) {
        return draw_fused(logits, rows);
    }
    let (b, vocab) = logits.size2().expect("invariant: logits are [B, V]");
    let on = |v: Vec<f32>| upload(&v, device);
    let temps = on(rows
        .iter()
        .map(|r| r.params.log_prob_temperature() as f32)
        .collect());
    // Fewer passes over [B, vocab] where the settings allow: no division at T = 1.
    let scaled = if rows.iter().all(|r| r.params.log_prob_temperature() == 1.0) {
        logits.shallow_clone()
    } else {
        logits / temps.unsqueeze(1)
    };
    let log_probs = scaled.log_softmax(-1, Kind::Float);

    // What may be drawn: banned tokens (stop tokens before min_new_tokens) are out.
    let mut masked = scaled.shallow_clone();
    let banned: Vec<(i64, i64)> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            r.banned
                .iter()
                .filter(|&&t| (t as i64) < vocab)
                .map(move |&t| (i as i64, t as i64))
        })
        .collect();
    let nothing_banned = banned.is_empty();
    if !nothing_banned {
        let (ri, ti): (Vec<i64>, Vec<i64>) = banned.into_iter().unzip();
        let index = [Some(upload(&ri, device)), Some(upload(&ti, device))];
        let minus_infinity = Tensor::full([], f64::NEG_INFINITY, (Kind::Float, device));
        masked = masked.index_put(&index, &minus_infinity, false);
    }
    let any_greedy = rows.iter().any(|r| r.params.is_greedy());
    if rows.iter().all(|r| r.params.is_greedy()) {
        return finish(&log_probs, masked.argmax(-1, false));
    }
    // The distribution is exp(log_probs) with banned tokens zeroed (the inverse CDF below scales by
    // the total, so no renormalisation): the same arithmetic for a row whatever its neighbours ban.
    let mut probs = log_probs.exp();
    if !nothing_banned {
        probs = probs.masked_fill(&masked.isneginf(), 0.0);
    }
    if rows.iter().any(|r| r.params.min_p > 0.0) {
        let min_p = on(rows.iter().map(|r| r.params.min_p as f32).collect()).unsqueeze(1);
        let floor = probs.amax([-1i64].as_slice(), true) * min_p;
        probs = probs.masked_fill(&probs.lt_tensor(&floor), 0.0);
    }
    let uniforms = upload(
        &rows
            .iter()
            .map(|r| uniform(r.seed, r.step))
            .collect::<Vec<f64>>(),
        device,
    )
    .to_kind(Kind::Float)
    .unsqueeze(1);
    // Plain sampling: inverse CDF in vocabulary order.
    let cdf = probs.cumsum(-1, Kind::Float);
    let target = cdf.narrow(1, vocab - 1, 1) * &uniforms;
    let mut sampled = target
        .searchsorted(&cdf, false, true, "right", None::<Tensor>)
        .clamp(0, vocab - 1)
        .squeeze_dim(1);
    let truncates: Vec<bool> = rows
        .iter()
        .map(|r| r.params.top_k > 0 || r.params.top_p < 1.0)
        .collect();
    if truncates.iter().any(|&t| t) {
        // Top-k / top-p: inverse CDF over the kept tokens in descending order. Each row takes the
        // result of its own kind, so a row's token never depends on its neighbours' settings.
        let (sorted, order) = probs.sort(-1, true);
        let rank = Tensor::arange(vocab, (Kind::Int64, device)).unsqueeze(0);
        let top_k = upload(
            &rows
                .iter()
                .map(|r| {
                    if r.params.top_k > 0 {
                        r.params.top_k
                    } else {
                        vocab
                    }
                })
                .collect::<Vec<i64>>(),
            device,
        )
        .unsqueeze(1);
        let top_p = on(rows.iter().map(|r| r.params.top_p as f32).collect()).unsqueeze(1);
        // Keep rank r when r < k and the mass before it is still below p (the first is always kept).
        let before = sorted.cumsum(-1, Kind::Float) - &sorted;
        let keep = rank
            .lt_tensor(&top_k)
            .logical_and(&before.lt_tensor(&top_p).logical_or(&rank.eq(0)));
        let kept = sorted.masked_fill(&keep.logical_not(), 0.0);
        let cdf = kept.cumsum(-1, Kind::Float);
        let target = cdf.narrow(1, vocab - 1, 1) * &uniforms;
        let pick = target
            .searchsorted(&cdf, false, true, "right", None::<Tensor>)
            .clamp(0, vocab - 1);
        let truncated = order.gather(1, &pick, false).squeeze_dim(1);
        sampled = truncated.where_self(&upload(&truncates, device), &sampled);
    }
    if !any_greedy {
        return finish(&log_probs, sampled);
    }
    let greedy_tokens = masked.argmax(-1, false);
    let is_greedy = upload(
        &rows
            .iter()
            .map(|r| r.params.is_greedy())
            .collect::<Vec<bool>>(),
        device,
    );
    let tokens = greedy_tokens.where_self(&is_greedy, &sampled);
    debug_assert_eq!(tokens.size(), [b]);
    finish(&log_probs, tokens)
}

impl RowSampling<'_> {
    /// Greedy or plain temperature sampling: no truncation, nothing banned.
    fn is_plain(&self) -> bool {
        let p = self.params;
        p.top_k == 0 && p.top_p >= 1.0 && p.min_p == 0.0 && self.banned.is_empty()
    }
}

/// [`draw`] for greedy and plain rows on a GPU: ooze's sampling kernel, one block per row, the
/// same definitions (log-prob of `logits / T`, inverse CDF in vocabulary order with the row's
/// uniform), one upload of the settings and one download of the results. The log-probs are the
/// trainer's kernel's, bitwise: the kernel scales by `1/T` as the trainer does.
fn draw_fused(logits: &Tensor, rows: &[RowSampling<'_>]) -> Tensor {
    let greedy = |r: &RowSampling<'_>| r.params.is_greedy();
    let mut params: Vec<f32> = rows
        .iter()
        .map(|r| (1.0 / r.params.log_prob_temperature()) as f32)
        .collect();
    params.extend(rows.iter().map(|r| if greedy(r) { 1.0 } else { 0.0 }));
    params.extend(rows.iter().map(|r| uniform(r.seed, r.step) as f32));
    let params = upload(&params, logits.device()).view([3, rows.len() as i64]);
    kernels::sample(logits, &params)
        .expect("invariant: fp32 [B, V] logits and [3, B] settings on one GPU are valid")
}

/// `[2, B]` float64 on the host (tokens, log-probs) → draws.
fn host_draws(both: &Tensor) -> Vec<Draw> {
    let tokens = Vec::<f64>::try_from(both.get(0)).expect("invariant: token ids");
    let chosen = Vec::<f64>::try_from(both.get(1)).expect("invariant: log-probs");
    tokens
        .into_iter()
        .zip(chosen)
        .map(|(t, lp)| Draw {
            token: t as u32,
            log_prob: lp as f32,
        })
        .collect()
}

/// The chosen tokens with their log-probs, `[2, B]` float64.
fn finish(log_probs: &Tensor, tokens: Tensor) -> Tensor {
    let chosen = log_probs
        .gather(1, &tokens.unsqueeze(1), false)
        .squeeze_dim(1);
    Tensor::stack(
        &[tokens.to_kind(Kind::Double), chosen.to_kind(Kind::Double)],
        0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::SamplingParams;

    fn params(p: SamplingParams) -> Sampling {
        p.validate().unwrap()
    }

    #[test]
    fn uniform_is_spread_and_deterministic() {
        let xs: Vec<f64> = (0..10_000).map(|s| uniform(7, s)).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        assert_eq!(uniform(3, 4), uniform(3, 4));
        assert_ne!(uniform(3, 4), uniform(4, 3));
    }

    #[test]
    fn greedy_truncation_and_log_probs() {
        let logits = Tensor::from_slice(&[1.0f32, 3.0, 2.0, 0.5, 2.0, 1.0, 0.0, 4.0]).view([2, 4]);
        let greedy = params(SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        });
        let top1 = params(SamplingParams {
            top_k: Some(1),
            temperature: Some(0.7),
            ..Default::default()
        });
        let rows = [
            RowSampling {
                params: &greedy,
                seed: 0,
                step: 0,
                banned: &[],
            },
            RowSampling {
                params: &top1,
                seed: 9,
                step: 3,
                banned: &[],
            },
        ];
        let d = draw(&logits, &rows);
        assert_eq!((d[0].token, d[1].token), (1, 3));
        let expect0 = Tensor::from_slice(&[1.0f32, 3.0, 2.0, 0.5])
            .log_softmax(-1, Kind::Float)
            .double_value(&[1]);
        let expect1 = (Tensor::from_slice(&[2.0f32, 1.0, 0.0, 4.0]) / 0.7)
            .log_softmax(-1, Kind::Float)
            .double_value(&[3]);
        assert!(
            (d[0].log_prob as f64 - expect0).abs() < 1e-6
                && (d[1].log_prob as f64 - expect1).abs() < 1e-6
        );
        // Banning the best token moves greedy to the next one; the log-prob is still unbanned.
        let rows = [RowSampling {
            params: &greedy,
            seed: 0,
            step: 0,
            banned: &[1],
        }];
        let d = draw(&logits.narrow(0, 0, 1), &rows);
        assert_eq!(d[0].token, 2);
    }

    #[test]
    fn sampling_follows_the_distribution_and_top_p() {
        let logits = Tensor::from_slice(&[0.0f32, (3.0f32).ln(), -30.0]).view([1, 3]);
        let p = params(SamplingParams::default());
        let mut counts = [0usize; 3];
        for step in 0..4000 {
            counts[draw(
                &logits,
                &[RowSampling {
                    params: &p,
                    seed: 1,
                    step,
                    banned: &[],
                }],
            )[0]
            .token as usize] += 1;
        }
        let frac = counts[1] as f64 / 4000.0;
        assert!((frac - 0.75).abs() < 0.03 && counts[2] == 0, "{counts:?}");
        let nucleus = params(SamplingParams {
            top_p: Some(0.7),
            ..Default::default()
        });
        for step in 0..200 {
            assert_eq!(
                draw(
                    &logits,
                    &[RowSampling {
                        params: &nucleus,
                        seed: 2,
                        step,
                        banned: &[]
                    }]
                )[0]
                .token,
                1
            );
        }
    }

    #[test]
    fn tiny_and_hand_built_temperatures_give_finite_log_probs() {
        let logits = Tensor::from_slice(&[1.0f32, 3.0, 2.0, 0.5]).view([1, 4]);
        let validated = params(SamplingParams {
            temperature: Some(1e-300),
            ..Default::default()
        });
        // A `Sampling` built by hand (as in-process callers do) skips validation.
        let raw = Sampling {
            temperature: 1e-300,
            ..Sampling::default()
        };
        let truncated = Sampling {
            top_k: 2,
            ..raw.clone()
        };
        for p in [&validated, &raw, &truncated] {
            for step in 0..20 {
                let d = draw(
                    &logits,
                    &[RowSampling {
                        params: p,
                        seed: 5,
                        step,
                        banned: &[],
                    }],
                );
                // The argmax, with log_softmax(logits / 1e-5) ≈ 0 there.
                assert_eq!(d[0].token, 1, "{p:?}");
                assert!(
                    d[0].log_prob.is_finite() && d[0].log_prob.abs() < 1e-6,
                    "{d:?}"
                );
            }
        }
    }
}
