//! Sampling parameters: the wire shape (SGLang's `sampling_params`, every field optional) and the
//! validated form the engine uses. Parse, don't validate: only [`Sampling`] reaches the engine.
//!
//! The rules, in one place (the OpenAI endpoints and `ooze generate` go through them too):
//! - `temperature`: finite and ≥ 0; 0 is greedy. A temperature in (0, [`MIN_TEMPERATURE`]) is
//!   raised to [`MIN_TEMPERATURE`]: the log-prob definition is `log_softmax(logits / T)` at the
//!   drawn token, and in fp32 `logits / 1e-300` is ±inf (its log-softmax NaN). At T = 1e-5 the
//!   distribution is already a point mass on the argmax unless two logits are within ~1e-4, and the
//!   argmax's log-prob is ≈ 0, as it is for every smaller T, so the raised value keeps the
//!   definition (SGLang instead switches to greedy below 1e-5, with log-probs at T = 1).
//! - `top_p` in (0, 1]; `top_k` ≥ 0, or -1 for off (0 is off too); `min_p` in [0, 1].
//! - `max_new_tokens` in [0, [`MAX_NEW_TOKENS`]] (0 = no new tokens: the prompt is only
//!   prefilled, useful for its log-probs); `min_new_tokens` ≤ `max_new_tokens`. Whether prompt +
//!   `max_new_tokens` fits a sequence is the engine's check at submission.
//! - stop strings non-empty.

use serde::{Deserialize, Serialize};

/// `sampling_params` as clients send them. Fields it has no place for are left to the caller (the
/// server ignores and counts them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    #[serde(alias = "sampling_seed")]
    pub seed: Option<u64>,
    pub max_new_tokens: Option<usize>,
    pub min_new_tokens: Option<usize>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub stop: Option<StopStrings>,
    pub ignore_eos: Option<bool>,
    /// Drop special tokens when turning the output into text (default true, as in SGLang).
    pub skip_special_tokens: Option<bool>,
    /// Accepted for SGLang compatibility: ooze always keeps the stop text in the output.
    pub no_stop_trim: Option<bool>,
}

/// One stop string or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopStrings {
    One(String),
    Many(Vec<String>),
}

/// A sampling parameter out of range; names the field and the allowed range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("sampling_params.{field}: {message}")]
pub struct ParamError {
    pub field: &'static str,
    pub message: String,
}

/// The smallest sampling temperature; smaller positive ones are raised to it (see the module
/// header).
pub const MIN_TEMPERATURE: f64 = 1e-5;

/// The most new tokens a request may ask for: far beyond any sequence an engine holds, small
/// enough that lengths never overflow.
pub const MAX_NEW_TOKENS: usize = u32::MAX as usize;

/// Validated sampling parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 = greedy; otherwise at least [`MIN_TEMPERATURE`].
    pub temperature: f64,
    /// 1 = off.
    pub top_p: f64,
    /// 0 = off.
    pub top_k: i64,
    /// 0 = off.
    pub min_p: f64,
    /// `None`: the engine draws one (and reports it).
    pub seed: Option<u64>,
    pub max_new_tokens: usize,
    pub min_new_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    /// The draw counter of the first new token (0 for a new request). A request that continues a
    /// partial output (a rollout paused by a weight update and resumed) sets it to the tokens
    /// already drawn, so that its draws are the ones it would have made uninterrupted: each
    /// draw depends only on the seed and this counter.
    pub first_draw: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        SamplingParams::default()
            .validate()
            .expect("invariant: defaults are valid")
    }
}

impl Sampling {
    /// Greedy: the argmax is drawn. Also true for values only a hand-built `Sampling` can hold
    /// (negative or NaN), so that they never reach a division.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0
    }

    /// The `T` of the log-prob definition `log_softmax(logits / T)`: 1 for greedy requests, else
    /// the temperature, never below [`MIN_TEMPERATURE`] (a hand-built `Sampling` may skip
    /// [`SamplingParams::validate`]).
    pub fn log_prob_temperature(&self) -> f64 {
        if self.is_greedy() {
            1.0
        } else {
            self.temperature.max(MIN_TEMPERATURE)
        }
    }
}

impl SamplingParams {
    pub fn validate(self) -> Result<Sampling, ParamError> {
        let err = |field, message: String| ParamError { field, message };
        let mut temperature = self.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(err(
                "temperature",
                format!("must be a finite number ≥ 0 (0 = greedy), got {temperature}"),
            ));
        }
        if temperature > 0.0 && temperature < MIN_TEMPERATURE {
            temperature = MIN_TEMPERATURE;
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(err("top_p", format!("must be in (0, 1], got {top_p}")));
        }
        let top_k = match self.top_k.unwrap_or(0) {
            -1 => 0,
            k if k >= 0 => k,
            k => {
                return Err(err(
                    "top_k",
                    format!("must be ≥ 0 (or -1 for off), got {k}"),
                ))
            }
        };
        let min_p = self.min_p.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&min_p) {
            return Err(err("min_p", format!("must be in [0, 1], got {min_p}")));
        }
        let max_new_tokens = self.max_new_tokens.unwrap_or(128);
        if max_new_tokens > MAX_NEW_TOKENS {
            return Err(err(
                "max_new_tokens",
                format!("must be in [0, {MAX_NEW_TOKENS}], got {max_new_tokens}"),
            ));
        }
        let min_new_tokens = self.min_new_tokens.unwrap_or(0);
        if min_new_tokens > max_new_tokens {
            return Err(err(
                "min_new_tokens",
                format!("{min_new_tokens} exceeds max_new_tokens {max_new_tokens}"),
            ));
        }
        let stop = match self.stop {
            None => Vec::new(),
            Some(StopStrings::One(s)) => vec![s],
            Some(StopStrings::Many(v)) => v,
        };
        if stop.iter().any(|s| s.is_empty()) {
            return Err(err("stop", "stop strings must not be empty".into()));
        }
        Ok(Sampling {
            temperature,
            top_p,
            top_k,
            min_p,
            seed: self.seed,
            max_new_tokens,
            min_new_tokens,
            stop_token_ids: self.stop_token_ids.unwrap_or_default(),
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            first_draw: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors() {
        let s = Sampling::default();
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.max_new_tokens),
            (1.0, 1.0, 0, 128)
        );
        let bad = |p: SamplingParams| p.validate().unwrap_err().to_string();
        assert_eq!(
            bad(SamplingParams {
                top_p: Some(0.0),
                ..Default::default()
            }),
            "sampling_params.top_p: must be in (0, 1], got 0"
        );
        assert!(bad(SamplingParams {
            temperature: Some(-1.0),
            ..Default::default()
        })
        .starts_with("sampling_params.temperature"));
        assert!(bad(SamplingParams {
            min_new_tokens: Some(9),
            max_new_tokens: Some(3),
            ..Default::default()
        })
        .contains("exceeds max_new_tokens 3"));
        let json: SamplingParams =
            serde_json::from_str(r#"{"stop": "</answer>", "top_k": -1}"#).unwrap();
        let s = json.validate().unwrap();
        assert_eq!((s.stop, s.top_k), (vec!["</answer>".to_string()], 0));
        // A field it has no place for is left to the caller (the server counts it as ignored).
        let other: SamplingParams = serde_json::from_str(r#"{"temprature": 1}"#).unwrap();
        assert_eq!(other, SamplingParams::default());
    }

    fn bad(p: SamplingParams) -> String {
        p.validate().unwrap_err().to_string()
    }

    #[test]
    fn max_new_tokens_out_of_range_is_refused_not_wrapped() {
        for n in [1usize << 63, usize::MAX, MAX_NEW_TOKENS + 1] {
            let e = bad(SamplingParams {
                max_new_tokens: Some(n),
                ..Default::default()
            });
            assert_eq!(
                e,
                format!("sampling_params.max_new_tokens: must be in [0, 4294967295], got {n}")
            );
        }
        let zero = SamplingParams {
            max_new_tokens: Some(0),
            ..Default::default()
        };
        assert_eq!(zero.validate().unwrap().max_new_tokens, 0);
    }

    #[test]
    fn temperature_is_finite_non_negative_and_never_below_the_floor() {
        for t in [-1.0, -1e-300, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let e = bad(SamplingParams {
                temperature: Some(t),
                ..Default::default()
            });
            assert!(
                e.starts_with("sampling_params.temperature: must be a finite number ≥ 0"),
                "{t}: {e}"
            );
        }
        let at = |t: f64| {
            SamplingParams {
                temperature: Some(t),
                ..Default::default()
            }
            .validate()
            .unwrap()
        };
        for tiny in [1e-300, 5e-324, 1e-6] {
            let s = at(tiny);
            assert_eq!((s.temperature, s.is_greedy()), (MIN_TEMPERATURE, false));
            assert_eq!(s.log_prob_temperature(), MIN_TEMPERATURE);
        }
        let greedy = at(0.0);
        assert!(greedy.is_greedy());
        assert_eq!(greedy.log_prob_temperature(), 1.0);
        assert_eq!(at(0.7).log_prob_temperature(), 0.7);
        // A hand-built value that skipped validation still never divides by ~0.
        let raw = Sampling {
            temperature: 1e-300,
            ..Sampling::default()
        };
        assert_eq!(raw.log_prob_temperature(), MIN_TEMPERATURE);
        let nan = Sampling {
            temperature: f64::NAN,
            ..Sampling::default()
        };
        assert!(nan.is_greedy());
    }

    #[test]
    fn nan_and_out_of_range_truncation_settings_are_refused() {
        for (p, field) in [
            (
                SamplingParams {
                    top_p: Some(f64::NAN),
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_p: Some(1.5),
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    min_p: Some(f64::NAN),
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    top_k: Some(-2),
                    ..Default::default()
                },
                "top_k",
            ),
        ] {
            let e = bad(p);
            assert!(e.starts_with(&format!("sampling_params.{field}: ")), "{e}");
        }
    }
}
