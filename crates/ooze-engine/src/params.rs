//! Sampling parameters: the wire shape (SGLang's `sampling_params`, every field optional) and the
//! validated form the engine uses. Parse, don't validate: only [`Sampling`] reaches the engine.

use serde::{Deserialize, Serialize};

/// `sampling_params` as clients send them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingParams {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
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

/// Validated sampling parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
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
}

impl Default for Sampling {
    fn default() -> Self {
        SamplingParams::default()
            .validate()
            .expect("invariant: defaults are valid")
    }
}

impl SamplingParams {
    pub fn validate(self) -> Result<Sampling, ParamError> {
        let err = |field, message: String| ParamError { field, message };
        let temperature = self.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(err(
                "temperature",
                format!("must be a finite number ≥ 0, got {temperature}"),
            ));
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
        assert!(
            serde_json::from_str::<SamplingParams>(r#"{"temprature": 1}"#)
                .unwrap_err()
                .to_string()
                .contains("unknown field `temprature`")
        );
    }
}
