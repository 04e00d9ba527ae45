//! Token selection and the log-prob the trainer will see.
//!
//! Log-prob (one definition everywhere): `log_softmax(logits / T)` at the chosen token, before any
//! top-k / top-p / min-p truncation and before banning stop tokens under `min_new_tokens`; greedy
//! requests use T = 1. Sampling draws by inverse CDF over the truncated distribution with a uniform
//! number that depends only on the request's seed and the step, so a request's tokens depend only
//! on its seed and the logits — never on what else shares the batch.

use crate::params::Sampling;
use ooze_torch::tch::{Device, Kind, Tensor};

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

/// Draws one token per row of `logits [B, V]` (fp32, any device).
pub fn draw(logits: &Tensor, rows: &[RowSampling<'_>]) -> Vec<Draw> {
    let device = logits.device();
    let vocab = logits.size()[1];
    let temps: Vec<f32> = rows
        .iter()
        .map(|r| {
            if r.params.temperature > 0.0 {
                r.params.temperature as f32
            } else {
                1.0
            }
        })
        .collect();
    let scaled = logits / Tensor::from_slice(&temps).to_device(device).unsqueeze(1);
    let log_probs = scaled.log_softmax(-1, Kind::Float);
    let mut tokens = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let mut l = scaled.get(i as i64);
        if !row.banned.is_empty() {
            let banned: Vec<i64> = row
                .banned
                .iter()
                .map(|&t| t as i64)
                .filter(|&t| t < vocab)
                .collect();
            l = l.index_fill(
                0,
                &Tensor::from_slice(&banned).to_device(device),
                f64::NEG_INFINITY,
            );
        }
        let p = &row.params;
        if p.temperature == 0.0 {
            tokens.push(l.argmax(-1, false));
            continue;
        }
        if p.top_k > 0 && p.top_k < vocab {
            let (top, _) = l.topk(p.top_k, -1, true, true);
            l = l.masked_fill(&l.lt_tensor(&top.get(p.top_k - 1)), f64::NEG_INFINITY);
        }
        let mut probs = l.softmax(-1, Kind::Float);
        if p.min_p > 0.0 {
            let floor = probs.max() * p.min_p;
            probs = probs.masked_fill(&probs.lt_tensor(&floor), 0.0);
        }
        if p.top_p < 1.0 {
            let (sorted, order) = probs.sort(-1, true);
            // Keep a token when the mass before it is still below top_p.
            let before = sorted.cumsum(-1, Kind::Float) - &sorted;
            let drop_sorted = before.ge(p.top_p);
            let drop = drop_sorted.scatter(0, &order, &drop_sorted);
            probs = probs.masked_fill(&drop, 0.0);
        }
        let cdf = probs.cumsum(-1, Kind::Float);
        let target = cdf.get(vocab - 1) * uniform(row.seed, row.step);
        let token = target
            .unsqueeze(0)
            .searchsorted(&cdf, false, true, "right", None::<Tensor>)
            .clamp(0, vocab - 1)
            .squeeze();
        tokens.push(token);
    }
    let tokens = Tensor::stack(&tokens, 0).to_kind(Kind::Int64);
    let chosen = log_probs
        .gather(1, &tokens.unsqueeze(1), false)
        .squeeze_dim(1);
    let tokens =
        Vec::<i64>::try_from(tokens.to_device(Device::Cpu)).expect("invariant: int64 tokens");
    let chosen =
        Vec::<f32>::try_from(chosen.to_device(Device::Cpu)).expect("invariant: fp32 log-probs");
    tokens
        .into_iter()
        .zip(chosen)
        .map(|(t, lp)| Draw {
            token: t as u32,
            log_prob: lp,
        })
        .collect()
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
}
