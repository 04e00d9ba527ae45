//! `config.json` → [`ModelConfig`]: the Hugging Face config of a decoder, parsed once into concrete
//! fields. Family differences are data here, not code paths in the model:
//!
//! | family | q/k/v bias | o bias | q/k RMSNorm | head_dim | tied default |
//! |---|---|---|---|---|---|
//! | `qwen2` (Qwen2, Qwen2.5) | always | no | no | hidden / heads | false |
//! | `qwen3` | `attention_bias` | `attention_bias` | yes | explicit | false |
//! | `llama` (3, 3.1, 3.2) | `attention_bias` | `attention_bias` | no | `head_dim` or hidden / heads | false |
//!
//! RoPE comes from `rope_theta` + `rope_scaling` (transformers 4) or `rope_parameters`
//! (transformers 5); types `default` and `llama3` are supported.

use crate::error::{read_json, ModelError, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Model family: the `model_type` of config.json.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen2,
    Qwen3,
    Llama,
}

impl Family {
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Llama => "llama",
        }
    }

    pub fn architecture(self) -> &'static str {
        match self {
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Llama => "LlamaForCausalLM",
        }
    }
}

impl std::str::FromStr for Family {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "qwen2" | "qwen2.5" => Ok(Family::Qwen2),
            "qwen3" => Ok(Family::Qwen3),
            "llama" | "llama3" => Ok(Family::Llama),
            _ => Err(format!(
                "unknown family `{s}`; expected qwen2, qwen3 or llama"
            )),
        }
    }
}

/// Llama 3 frequency-dependent RoPE scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub llama3: Option<Llama3Scaling>,
}

/// A decoder's shape and quirks, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_layers: i64,
    pub num_heads: i64,
    pub num_kv_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope: Rope,
    pub max_position_embeddings: i64,
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    pub qk_norm: bool,
    /// `torch_dtype` / `dtype` of the checkpoint, if stated.
    pub dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    fn into_vec(self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![id],
            TokenIds::Many(ids) => ids,
        }
    }
}

#[derive(Deserialize, Default)]
struct RopeFields {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

/// config.json as transformers writes it (only the keys ooze reads; others are ignored).
#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    vocab_size: Option<i64>,
    hidden_size: Option<i64>,
    intermediate_size: Option<i64>,
    num_hidden_layers: Option<i64>,
    num_attention_heads: Option<i64>,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RopeFields>,
    rope_parameters: Option<RopeFields>,
    max_position_embeddings: Option<i64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    use_sliding_window: Option<bool>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<TokenIds>,
}

impl ModelConfig {
    /// Reads `DIR/config.json`.
    pub fn load(dir: &Path) -> Result<ModelConfig> {
        let path = dir.join("config.json");
        let value: serde_json::Value = read_json(&path, "a model config")?;
        Self::from_json(&path, value)
    }

    /// Parses a config.json value; `path` is used in error messages.
    pub fn from_json(path: &Path, value: serde_json::Value) -> Result<ModelConfig> {
        let hf: HfConfig = serde_json::from_value(value).map_err(|source| ModelError::Json {
            path: path.into(),
            what: "a model config",
            source,
        })?;
        let err = |key: &str, message: String| ModelError::Config {
            path: PathBuf::from(path),
            key: key.to_owned(),
            message,
        };
        let need = |key: &str, v: Option<i64>| -> Result<i64> {
            match v {
                Some(v) if v > 0 => Ok(v),
                Some(v) => Err(err(key, format!("must be a positive integer, got {v}"))),
                None => Err(err(key, "is required".into())),
            }
        };
        let model_type = hf
            .model_type
            .clone()
            .ok_or_else(|| err("model_type", "is required".into()))?;
        let family = match model_type.as_str() {
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "llama" => Family::Llama,
            _ => {
                return Err(ModelError::UnknownModelType {
                    path: path.into(),
                    model_type,
                })
            }
        };
        let hidden_size = need("hidden_size", hf.hidden_size)?;
        let num_heads = need("num_attention_heads", hf.num_attention_heads)?;
        let num_kv_heads = need(
            "num_key_value_heads",
            hf.num_key_value_heads.or(Some(num_heads)),
        )?;
        if num_heads % num_kv_heads != 0 {
            return Err(err(
                "num_key_value_heads",
                format!("{num_kv_heads} does not divide num_attention_heads {num_heads}"),
            ));
        }
        let head_dim = match hf.head_dim {
            Some(d) => need("head_dim", Some(d))?,
            None if hidden_size % num_heads == 0 => hidden_size / num_heads,
            None => {
                return Err(err(
                    "head_dim",
                    format!(
                    "missing, and hidden_size {hidden_size} is not a multiple of {num_heads} heads"
                ),
                ))
            }
        };
        if head_dim % 2 != 0 {
            return Err(err(
                "head_dim",
                format!("must be even for RoPE, got {head_dim}"),
            ));
        }
        if let Some(act) = &hf.hidden_act {
            if act != "silu" {
                return Err(err(
                    "hidden_act",
                    format!("`{act}` is not supported; expected silu"),
                ));
            }
        }
        if hf.use_sliding_window == Some(true) {
            return Err(err(
                "use_sliding_window",
                "sliding-window attention is not supported".into(),
            ));
        }
        let rope_fields = hf.rope_parameters.or(hf.rope_scaling).unwrap_or_default();
        let rope_key = "rope_parameters";
        let theta = rope_fields.rope_theta.or(hf.rope_theta).unwrap_or(10_000.0);
        let rope_type = rope_fields
            .rope_type
            .clone()
            .or(rope_fields.legacy_type.clone())
            .unwrap_or_else(|| "default".into());
        let llama3 = match rope_type.as_str() {
            "default" => None,
            "llama3" => {
                let f = |name: &str, v: Option<f64>| {
                    v.ok_or_else(|| err(rope_key, format!("rope type llama3 needs `{name}`")))
                };
                Some(Llama3Scaling {
                    factor: f("factor", rope_fields.factor)?,
                    low_freq_factor: f("low_freq_factor", rope_fields.low_freq_factor)?,
                    high_freq_factor: f("high_freq_factor", rope_fields.high_freq_factor)?,
                    original_max_position_embeddings: f(
                        "original_max_position_embeddings",
                        rope_fields.original_max_position_embeddings,
                    )?,
                })
            }
            other => {
                return Err(err(
                    rope_key,
                    format!("rope type `{other}` is not supported; expected default or llama3"),
                ))
            }
        };
        let attention_bias = hf.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias, qk_norm) = match family {
            Family::Qwen2 => (true, false, false),
            Family::Qwen3 => (attention_bias, attention_bias, true),
            Family::Llama => (attention_bias, attention_bias, false),
        };
        Ok(ModelConfig {
            family,
            vocab_size: need("vocab_size", hf.vocab_size)?,
            hidden_size,
            intermediate_size: need("intermediate_size", hf.intermediate_size)?,
            num_layers: need("num_hidden_layers", hf.num_hidden_layers)?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
            rope: Rope { theta, llama3 },
            max_position_embeddings: hf.max_position_embeddings.unwrap_or(32_768),
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: family == Family::Llama && hf.mlp_bias.unwrap_or(false),
            qk_norm,
            dtype: hf.dtype.or(hf.torch_dtype),
            bos_token_id: hf.bos_token_id,
            eos_token_ids: hf.eos_token_id.map(TokenIds::into_vec).unwrap_or_default(),
        })
    }

    /// Parameter count (embeddings counted once when tied).
    pub fn num_parameters(&self) -> i64 {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let attn = h * q
            + 2 * h * kv
            + q * h
            + if self.qkv_bias { q + 2 * kv } else { 0 }
            + if self.o_bias { h } else { 0 }
            + if self.qk_norm { 2 * self.head_dim } else { 0 };
        let mlp = 3 * h * i + if self.mlp_bias { 2 * i + h } else { 0 };
        let layer = attn + mlp + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_layers * layer + h + head
    }
}

/// `generation_config.json`: the EOS ids generation stops on (possibly a list).
pub fn load_generation_eos(dir: &Path) -> Result<Option<Vec<u32>>> {
    #[derive(Deserialize)]
    struct GenerationConfig {
        eos_token_id: Option<TokenIds>,
    }
    let path = dir.join("generation_config.json");
    if !path.exists() {
        return Ok(None);
    }
    let config: GenerationConfig = read_json(&path, "a generation config")?;
    Ok(config.eos_token_id.map(TokenIds::into_vec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: serde_json::Value) -> Result<ModelConfig> {
        ModelConfig::from_json(Path::new("m/config.json"), value)
    }

    fn qwen2() -> serde_json::Value {
        json!({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true,
               "eos_token_id": 7, "hidden_act": "silu"})
    }

    #[test]
    fn qwen2_defaults() {
        let c = parse(qwen2()).unwrap();
        assert_eq!(c.family, Family::Qwen2);
        assert_eq!(c.head_dim, 16);
        assert!(c.qkv_bias && !c.o_bias && !c.qk_norm && c.tie_word_embeddings);
        assert_eq!(
            c.rope,
            Rope {
                theta: 1e6,
                llama3: None
            }
        );
        assert_eq!(c.eos_token_ids, vec![7]);
    }

    #[test]
    fn llama3_rope_from_either_key() {
        let scaling = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let mut v = qwen2();
        v["model_type"] = json!("llama");
        v["rope_scaling"] = scaling.clone();
        v["eos_token_id"] = json!([1, 2]);
        let old = parse(v.clone()).unwrap();
        assert_eq!(old.rope.llama3.unwrap().factor, 8.0);
        assert!(!old.qkv_bias);
        assert_eq!(old.eos_token_ids, vec![1, 2]);
        let mut new_style = v;
        new_style.as_object_mut().unwrap().remove("rope_scaling");
        new_style.as_object_mut().unwrap().remove("rope_theta");
        let mut params = scaling;
        params["rope_theta"] = json!(500000.0);
        new_style["rope_parameters"] = params;
        let new = parse(new_style).unwrap();
        assert_eq!(new.rope.theta, 500000.0);
        assert_eq!(new.rope.llama3, old.rope.llama3);
    }

    #[test]
    fn errors_name_the_key() {
        let mut v = qwen2();
        v["model_type"] = json!("gpt_neox");
        assert_eq!(
            parse(v).unwrap_err().to_string(),
            "m/config.json: unknown model_type `gpt_neox`; ooze supports qwen2, qwen3 and llama"
        );
        let mut v = qwen2();
        v.as_object_mut().unwrap().remove("hidden_size");
        assert_eq!(
            parse(v).unwrap_err().to_string(),
            "m/config.json: key `hidden_size`: is required"
        );
        let mut v = qwen2();
        v["num_key_value_heads"] = json!(3);
        assert!(parse(v)
            .unwrap_err()
            .to_string()
            .contains("`num_key_value_heads`: 3 does not divide"));
        let mut v = qwen2();
        v["rope_scaling"] = json!({"type": "yarn", "factor": 4.0});
        assert!(parse(v)
            .unwrap_err()
            .to_string()
            .contains("rope type `yarn` is not supported"));
        let mut v = qwen2();
        v["hidden_size"] = json!("wide");
        assert!(parse(v)
            .unwrap_err()
            .to_string()
            .starts_with("m/config.json: not valid JSON for a model config"));
    }

    #[test]
    fn counts_parameters_of_qwen2_5_0_5b() {
        let v = json!({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
            "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "tie_word_embeddings": true});
        // The published parameter count of Qwen2.5-0.5B.
        assert_eq!(parse(v).unwrap().num_parameters(), 494_032_768);
    }
}
