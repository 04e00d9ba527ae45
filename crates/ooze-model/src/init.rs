//! `ooze init-model`: a new model directory in the real Hugging Face format — `config.json`,
//! `generation_config.json`, safetensors weights, a byte-level BPE `tokenizer.json` trained on given
//! text, and `tokenizer_config.json` with a chat template — so tests and demos load it through the
//! same code path as a downloaded checkpoint, and transformers loads it too.
//!
//! Weights are random (normal, std 0.02, as transformers initialises; norms 1, biases 0) and depend
//! only on the seed.

use crate::checkpoint::{save_weights, SaveOptions};
use crate::config::{Family, ModelConfig};
use crate::error::{write_atomic, ModelError, Result};
use ooze_torch::tch::{Device, Kind, Tensor};
use serde_json::json;
use std::path::Path;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::SplitDelimiterBehavior;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    TokenizerBuilder,
};

const CHATML: &str = include_str!("../templates/chatml.jinja");
/// The pre-tokenisation split of the Qwen2/Qwen3 tokenizers (digits one by one).
const QWEN_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The pre-tokenisation split of the Llama 3 tokenizer (digits in runs of up to three).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3: &str = include_str!("../templates/llama3.jinja");

/// Model shapes `init-model` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// 2 layers, hidden 64: unit tests and CPU demos.
    Tiny,
    /// 4 layers, hidden 256: CPU integration runs.
    Small,
    /// 8 layers, hidden 512 (about 25M parameters): GPU recipe runs whose skill a small model
    /// learns too slowly (memagent's reading).
    Medium,
    /// The Qwen2.5-0.5B shape (24 layers, hidden 896, 14/2 heads, vocab 151,936): GPU benchmarks.
    Qwen05b,
    /// The Qwen3-4B shape (36 layers, hidden 2560, 32/8 heads of 128, vocab 151,936; use it with
    /// `--family qwen3`): single-GPU benchmarks at a mid size.
    Qwen4b,
    /// The Qwen2.5-7B shape (28 layers, hidden 3584, 28/4 heads, vocab 152,064, untied head):
    /// multi-GPU benchmarks.
    Qwen7b,
}

impl std::str::FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tiny" => Ok(Size::Tiny),
            "small" => Ok(Size::Small),
            "medium" => Ok(Size::Medium),
            "0.5b" | "0.5B" => Ok(Size::Qwen05b),
            "4b" | "4B" => Ok(Size::Qwen4b),
            "7b" | "7B" => Ok(Size::Qwen7b),
            _ => Err(format!(
                "unknown size `{s}`; expected tiny, small, medium, 0.5b, 4b or 7b"
            )),
        }
    }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub family: Family,
    pub size: Size,
    /// BPE merges are learned until the vocabulary (special tokens included) has this many entries.
    pub tokenizer_vocab: usize,
    /// Embedding rows; at least the tokenizer's vocabulary (real checkpoints pad it).
    pub vocab_size: Option<i64>,
    pub tie_word_embeddings: bool,
    pub seed: i64,
    pub dtype: Kind,
    pub max_shard_bytes: usize,
}

impl InitOptions {
    pub fn new(family: Family, size: Size) -> InitOptions {
        InitOptions {
            family,
            size,
            tokenizer_vocab: 1024,
            vocab_size: match size {
                Size::Qwen05b | Size::Qwen4b => Some(151_936),
                Size::Qwen7b => Some(152_064),
                _ => None,
            },
            tie_word_embeddings: size != Size::Qwen7b,
            seed: 0,
            dtype: Kind::Float,
            max_shard_bytes: 2 << 30,
        }
    }
}

impl InitOptions {
    /// The config of the model these options build (the vocabulary: `vocab_size`, or the
    /// tokenizer's size asked for), without building it: for plans and estimates.
    pub fn model_config(&self) -> Result<ModelConfig> {
        let vocab = self.vocab_size.unwrap_or(self.tokenizer_vocab as i64);
        ModelConfig::from_json(Path::new("<init options>"), shape(self, vocab))
    }
}

struct FamilyTokens {
    special: &'static [&'static str],
    /// Added tokens that decode even with skip_special_tokens (tool-call markup).
    plain: &'static [&'static str],
    bos: Option<&'static str>,
    eos: &'static str,
    pad: &'static str,
    /// Tokens generation stops at.
    stop: &'static [&'static str],
}

fn family_tokens(family: Family) -> FamilyTokens {
    match family {
        Family::Qwen2 => FamilyTokens {
            special: &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            plain: &[
                "<tool_call>",
                "</tool_call>",
                "<tool_response>",
                "</tool_response>",
            ],
            bos: None,
            eos: "<|im_end|>",
            pad: "<|endoftext|>",
            stop: &["<|im_end|>", "<|endoftext|>"],
        },
        Family::Qwen3 => FamilyTokens {
            special: &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            plain: &[
                "<tool_call>",
                "</tool_call>",
                "<tool_response>",
                "</tool_response>",
                "<think>",
                "</think>",
            ],
            bos: None,
            eos: "<|im_end|>",
            pad: "<|endoftext|>",
            stop: &["<|im_end|>", "<|endoftext|>"],
        },
        Family::Llama => FamilyTokens {
            special: &[
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|eom_id|>",
                "<|python_tag|>",
            ],
            plain: &[],
            bos: Some("<|begin_of_text|>"),
            eos: "<|eot_id|>",
            pad: "<|end_of_text|>",
            stop: &["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
        },
    }
}

fn chat_template(family: Family) -> String {
    match family {
        Family::Qwen2 => format!("{{%- set thinking = false -%}}\n{CHATML}"),
        Family::Qwen3 => format!("{{%- set thinking = true -%}}\n{CHATML}"),
        Family::Llama => LLAMA3.to_owned(),
    }
}

/// A tokenizer corpus from chat JSONL (`{"messages", "tools"?}` per line, as `ooze sft` reads):
/// each conversation rendered with the family's chat template, so the vocabulary is learned on
/// the text the model will see, template included. `origin` names the file in errors.
pub fn render_chat_corpus(family: Family, jsonl: &str, origin: &str) -> Result<String> {
    let tokens = family_tokens(family);
    let mut special = std::collections::BTreeMap::new();
    if let Some(bos) = tokens.bos {
        special.insert("bos_token".to_owned(), bos.to_owned());
    }
    special.insert("eos_token".to_owned(), tokens.eos.to_owned());
    special.insert("pad_token".to_owned(), tokens.pad.to_owned());
    let template = crate::ChatTemplate::new(
        &chat_template(family),
        "the family's chat template",
        special,
    )?;
    let mut corpus = String::new();
    for (i, line) in jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{origin}:{}", i + 1);
        let row: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| ModelError::Invalid(format!("{}: expected a JSON object: {e}", at())))?;
        let Some(messages) = row.get("messages").and_then(|m| m.as_array()) else {
            return Err(ModelError::Invalid(format!(
                "{}: expected a `messages` list (chat JSONL, as `ooze sft` reads)",
                at()
            )));
        };
        let tools = match row.get("tools") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Array(tools)) => Some(tools.clone()),
            Some(_) => {
                return Err(ModelError::Invalid(format!(
                    "{}: `tools` must be a list",
                    at()
                )))
            }
        };
        let options = crate::RenderOptions {
            tools,
            ..Default::default()
        };
        let text = template
            .render(messages, &options)
            .map_err(|e| ModelError::Invalid(format!("{}: {e}", at())))?;
        corpus.push_str(&text);
        corpus.push('\n');
    }
    Ok(corpus)
}

/// The family's real pre-tokenizer: a regex split, then byte-level mapping. transformers 5
/// rebuilds Qwen2 tokenizers with this split whatever tokenizer.json says, so it must match.
fn pre_tokenizer(family: Family) -> Result<PreTokenizerWrapper> {
    let pattern = if family == Family::Llama {
        LLAMA3_SPLIT
    } else {
        QWEN_SPLIT
    };
    let split = Split::new(
        SplitPattern::Regex(pattern.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| ModelError::Invalid(format!("pre-tokenizer regex: {e}")))?;
    let byte_level = ByteLevel::default()
        .add_prefix_space(false)
        .trim_offsets(false)
        .use_regex(false);
    Ok(PreTokenizerWrapper::Sequence(PreSequence::new(vec![
        split.into(),
        byte_level.into(),
    ])))
}

/// Trains a byte-level BPE tokenizer on `corpus` and returns its `tokenizer.json` text.
pub fn train_tokenizer(family: Family, corpus: &str, vocab: usize) -> Result<String> {
    let tokens = family_tokens(family);
    let fail =
        |e: tokenizers::Error| ModelError::Invalid(format!("tokenizer training failed: {e}"));
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab.saturating_sub(tokens.special.len() + tokens.plain.len()))
        .min_frequency(2)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default())
    .with_normalizer(if family == Family::Llama {
        None
    } else {
        Some(NormalizerWrapper::from(NFC))
    })
    .with_pre_tokenizer(Some(pre_tokenizer(family)?))
    .with_post_processor(Some(ByteLevel::default().trim_offsets(false).into()))
    .with_decoder(Some(ByteLevel::default().into()))
    .build()
    .map_err(fail)?;
    tokenizer
        .train(&mut trainer, corpus.lines().map(|l| format!("{l}\n")))
        .map_err(fail)?;
    let special: Vec<AddedToken> = tokens
        .special
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    let plain: Vec<AddedToken> = tokens
        .plain
        .iter()
        .map(|t| AddedToken::from(*t, false))
        .collect();
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&plain);
    if let Some(bos) = tokens.bos {
        let id = tokenizer
            .token_to_id(bos)
            .expect("invariant: bos was just added");
        let processor = TemplateProcessing::builder()
            .try_single(format!("{bos}:0 $A:0"))
            .and_then(|b| b.try_pair(format!("{bos}:0 $A:0 {bos}:1 $B:1")))
            .map_err(|e| ModelError::Invalid(format!("post-processor: {e}")))?
            .special_tokens(vec![(bos, id)])
            .build()
            .map_err(|e| ModelError::Invalid(format!("post-processor: {e}")))?;
        tokenizer.with_post_processor(Some(PostProcessorWrapper::from(processor)));
    }
    tokenizer.to_string(true).map_err(fail)
}

fn shape(options: &InitOptions, vocab: i64) -> serde_json::Value {
    let (hidden, inter, layers, heads, kv) = match options.size {
        Size::Tiny => (64, 176, 2, 4, 2),
        Size::Small => (256, 768, 4, 8, 2),
        Size::Medium => (512, 1536, 8, 8, 2),
        Size::Qwen05b => (896, 4864, 24, 14, 2),
        Size::Qwen4b => (2560, 9728, 36, 32, 8),
        Size::Qwen7b => (3584, 18944, 28, 28, 4),
    };
    // Qwen3-4B's heads are wider than hidden / heads.
    let head_dim = match options.size {
        Size::Qwen4b => 128,
        _ => hidden / heads,
    };
    let family = options.family;
    let mut c = json!({
        "architectures": [family.architecture()],
        "model_type": family.model_type(),
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "tie_word_embeddings": options.tie_word_embeddings,
        "use_cache": true,
        "torch_dtype": if options.dtype == Kind::BFloat16 { "bfloat16" } else { "float32" },
    });
    let extra = match family {
        Family::Qwen2 => {
            json!({"rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "max_position_embeddings": 32768,
            "use_sliding_window": false, "sliding_window": null, "max_window_layers": layers, "attention_dropout": 0.0})
        }
        Family::Qwen3 => {
            json!({"rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "max_position_embeddings": 40960,
            "attention_bias": false, "use_sliding_window": false, "sliding_window": null, "max_window_layers": layers, "attention_dropout": 0.0})
        }
        Family::Llama => {
            json!({"rms_norm_eps": 1e-5, "rope_theta": 500_000.0, "max_position_embeddings": 131072,
            "attention_bias": false, "mlp_bias": false, "attention_dropout": 0.0, "pretraining_tp": 1,
            "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
        }
    };
    for (k, v) in extra.as_object().expect("invariant: object literal") {
        c[k] = v.clone();
    }
    c
}

/// A seeded normal sampler (SplitMix64 + Box–Muller) owned by the caller, so concurrent model
/// builds cannot disturb each other's streams the way libtorch's global generator would.
///
/// The stream is counter-based: sample `j` is a pure function of the seed and `j` (pair `j / 2`
/// draws uniforms `j - j % 2` and `j - j % 2 + 1`; even samples take the cosine, odd the sine), so
/// a large tensor fills on every core and still gets the values one thread would draw in order.
struct Normal {
    origin: u64,
    next: u64,
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Normal {
    fn new(seed: i64) -> Normal {
        Normal {
            origin: seed as u64 ^ GOLDEN,
            next: 0,
        }
    }

    /// The `k`-th uniform in (0, 1) of the stream (SplitMix64's output for counter k + 1).
    fn uniform(origin: u64, k: u64) -> f64 {
        let mut z = origin.wrapping_add(k.wrapping_add(1).wrapping_mul(GOLDEN));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Pair `p`'s two samples: (sample 2p, sample 2p + 1).
    fn pair(origin: u64, p: u64) -> (f32, f32) {
        let r = (-2.0 * Normal::uniform(origin, 2 * p).ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * Normal::uniform(origin, 2 * p + 1);
        ((r * theta.cos()) as f32, (r * theta.sin()) as f32)
    }

    fn tensor(&mut self, shape: &[i64], std: f32) -> Tensor {
        let n: i64 = shape.iter().product();
        let mut values = vec![0f32; n as usize];
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        let chunk = values.len().div_ceil(threads).max(1 << 16);
        Normal::fill(&mut values, self.origin, self.next, chunk, std);
        self.next += n as u64;
        Tensor::from_slice(&values).view(shape)
    }

    /// Samples `first..` (times `std`) into `values`, `chunk` of them to a thread.
    fn fill(values: &mut [f32], origin: u64, first: u64, chunk: usize, std: f32) {
        if values.len() <= chunk {
            return Normal::fill_part(values, origin, first, std);
        }
        std::thread::scope(|scope| {
            for (c, part) in values.chunks_mut(chunk).enumerate() {
                let from = first + (c * chunk) as u64;
                scope.spawn(move || Normal::fill_part(part, origin, from, std));
            }
        });
    }

    fn fill_part(part: &mut [f32], origin: u64, from: u64, std: f32) {
        let mut pair = (u64::MAX, (0.0, 0.0));
        for (i, v) in part.iter_mut().enumerate() {
            let j = from + i as u64;
            if pair.0 != j / 2 {
                pair = (j / 2, Normal::pair(origin, j / 2));
            }
            let (even, odd) = pair.1;
            *v = if j.is_multiple_of(2) { even } else { odd } * std;
        }
    }
}

/// Random weights for `config`, named as in the transformers state dict.
pub fn random_weights(config: &ModelConfig, seed: i64) -> Vec<(String, Tensor)> {
    let mut rng = Normal::new(seed);
    let opts = (Kind::Float, Device::Cpu);
    let mut normal = |shape: &[i64]| rng.tensor(shape, 0.02);
    let (h, hd) = (config.hidden_size, config.head_dim);
    let (q, kv, i) = (
        config.num_heads * hd,
        config.num_kv_heads * hd,
        config.intermediate_size,
    );
    let mut out = vec![(
        "model.embed_tokens.weight".to_owned(),
        normal(&[config.vocab_size, h]),
    )];
    for l in 0..config.num_layers {
        let p = format!("model.layers.{l}");
        out.push((
            format!("{p}.input_layernorm.weight"),
            Tensor::ones([h], opts),
        ));
        for (name, rows, cols, bias) in [
            ("self_attn.q_proj", q, h, config.qkv_bias),
            ("self_attn.k_proj", kv, h, config.qkv_bias),
            ("self_attn.v_proj", kv, h, config.qkv_bias),
            ("self_attn.o_proj", h, q, config.o_bias),
            ("mlp.gate_proj", i, h, config.mlp_bias),
            ("mlp.up_proj", i, h, config.mlp_bias),
            ("mlp.down_proj", h, i, config.mlp_bias),
        ] {
            out.push((format!("{p}.{name}.weight"), normal(&[rows, cols])));
            if bias {
                out.push((format!("{p}.{name}.bias"), Tensor::zeros([rows], opts)));
            }
        }
        if config.qk_norm {
            out.push((
                format!("{p}.self_attn.q_norm.weight"),
                Tensor::ones([hd], opts),
            ));
            out.push((
                format!("{p}.self_attn.k_norm.weight"),
                Tensor::ones([hd], opts),
            ));
        }
        out.push((
            format!("{p}.post_attention_layernorm.weight"),
            Tensor::ones([h], opts),
        ));
    }
    out.push(("model.norm.weight".to_owned(), Tensor::ones([h], opts)));
    if !config.tie_word_embeddings {
        out.push(("lm_head.weight".to_owned(), normal(&[config.vocab_size, h])));
    }
    out
}

/// Writes a complete model directory into `out` and returns its config.
pub fn init_model(out: &Path, corpus: &str, options: &InitOptions) -> Result<ModelConfig> {
    std::fs::create_dir_all(out).map_err(ModelError::io_doing("create directory", out))?;
    let tokens = family_tokens(options.family);
    let tokenizer_json = train_tokenizer(options.family, corpus, options.tokenizer_vocab)?;
    let tokenizer = tokenizers::Tokenizer::from_bytes(tokenizer_json.as_bytes())
        .map_err(|e| ModelError::Invalid(format!("trained tokenizer does not reload: {e}")))?;
    let id = |t: &str| {
        tokenizer
            .token_to_id(t)
            .expect("invariant: family tokens were added")
    };
    let tokenizer_vocab = tokenizer.get_vocab_size(true) as i64;
    let vocab = options.vocab_size.unwrap_or(tokenizer_vocab);
    if vocab < tokenizer_vocab {
        return Err(ModelError::Invalid(format!(
            "vocab_size {vocab} is smaller than the tokenizer's {tokenizer_vocab} tokens"
        )));
    }
    let mut config_json = shape(options, vocab);
    let stop: Vec<u32> = tokens.stop.iter().map(|t| id(t)).collect();
    config_json["eos_token_id"] = json!(id(tokens.eos));
    config_json["bos_token_id"] = json!(tokens.bos.map(id).unwrap_or_else(|| id(tokens.pad)));
    config_json["pad_token_id"] = json!(id(tokens.pad));
    let config = ModelConfig::from_json(&out.join("config.json"), config_json.clone())?;

    let weights = random_weights(&config, options.seed);
    save_weights(
        out,
        &weights,
        SaveOptions {
            max_shard_bytes: options.max_shard_bytes,
            kind: options.dtype,
        },
    )?;
    let generation = json!({"bos_token_id": config_json["bos_token_id"], "eos_token_id": stop, "pad_token_id": id(tokens.pad), "do_sample": true, "temperature": 1.0, "top_p": 1.0});
    let tokenizer_config = json!({
        "tokenizer_class": if options.family == Family::Llama { "PreTrainedTokenizerFast" } else { "Qwen2Tokenizer" },
        "bos_token": tokens.bos,
        "eos_token": tokens.eos,
        "pad_token": tokens.pad,
        "unk_token": null,
        "model_max_length": config.max_position_embeddings,
        "clean_up_tokenization_spaces": false,
        "chat_template": chat_template(options.family),
    });
    let pretty = |v: &serde_json::Value| {
        serde_json::to_string_pretty(v).expect("invariant: JSON value serialises")
    };
    write_atomic(&out.join("tokenizer.json"), tokenizer_json.as_bytes())?;
    write_atomic(
        &out.join("tokenizer_config.json"),
        pretty(&tokenizer_config).as_bytes(),
    )?;
    write_atomic(
        &out.join("generation_config.json"),
        pretty(&generation).as_bytes(),
    )?;
    // config.json last: a directory with a config is a complete model.
    write_atomic(&out.join("config.json"), pretty(&config_json).as_bytes())?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::Normal;

    /// The stream as one thread draws it in order: a SplitMix64 state stepped once per uniform,
    /// Box–Muller pairs, the sine kept as the next sample (also across tensors).
    struct Sequential {
        state: u64,
        spare: Option<f32>,
    }

    impl Sequential {
        fn uniform(&mut self) -> f64 {
            self.state = self.state.wrapping_add(super::GOLDEN);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }

        fn sample(&mut self) -> f32 {
            if let Some(v) = self.spare.take() {
                return v;
            }
            let r = (-2.0 * self.uniform().ln()).sqrt();
            let theta = 2.0 * std::f64::consts::PI * self.uniform();
            self.spare = Some((r * theta.sin()) as f32);
            (r * theta.cos()) as f32
        }
    }

    #[test]
    fn tensors_filled_on_every_core_hold_the_sequential_stream() {
        let seed = 7;
        let mut parallel = Normal::new(seed);
        let mut sequential = Sequential {
            state: seed as u64 ^ super::GOLDEN,
            spare: None,
        };
        // Odd sizes carry a pair's second sample into the next tensor; the large one spans
        // several threads' chunks.
        for shape in [vec![3i64], vec![5, 7], vec![(1 << 18) + 3, 1], vec![2, 2]] {
            let got = Vec::<f32>::try_from(parallel.tensor(&shape, 0.02).view([-1])).unwrap();
            let want: Vec<f32> = (0..got.len()).map(|_| sequential.sample() * 0.02).collect();
            assert_eq!(got, want, "shape {shape:?}");
        }
    }

    #[test]
    fn chunks_that_split_a_pair_hold_the_sequential_stream() {
        // From sample 7 in chunks of 5: the chunks starting at 7, 17 and 27 start inside a pair.
        let mut sequential = Sequential {
            state: 3u64 ^ super::GOLDEN,
            spare: None,
        };
        for _ in 0..7 {
            sequential.sample();
        }
        let want: Vec<f32> = (0..23).map(|_| sequential.sample()).collect();
        let mut got = vec![0f32; 23];
        Normal::fill(&mut got, 3u64 ^ super::GOLDEN, 7, 5, 1.0);
        assert_eq!(got, want);
    }
}
