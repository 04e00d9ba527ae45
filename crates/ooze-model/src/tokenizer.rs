//! Tokenizer of an HF model directory: `tokenizer.json` through the `tokenizers` crate (the same
//! code as the Python package), plus what `tokenizer_config.json` adds — special-token strings for
//! chat templates and the chat template itself (a `chat_template.jinja` file wins over the config's
//! `chat_template`, as in transformers 5).

use crate::chat_template::ChatTemplate;
use crate::error::{read_json, ModelError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
#[serde(untagged)]
enum SpecialToken {
    Text(String),
    Added { content: String },
}

impl SpecialToken {
    fn text(self) -> String {
        match self {
            SpecialToken::Text(text) | SpecialToken::Added { content: text } => text,
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Deserialize, Default)]
struct TokenizerConfigFile {
    bos_token: Option<SpecialToken>,
    eos_token: Option<SpecialToken>,
    pad_token: Option<SpecialToken>,
    unk_token: Option<SpecialToken>,
    chat_template: Option<TemplateField>,
}

/// Token ids with the byte range of `text` each came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoding {
    pub ids: Vec<u32>,
    pub offsets: Vec<(usize, usize)>,
}

/// A model's tokenizer and chat templates.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// Special-token strings by role (`bos_token`, `eos_token`, …), passed to chat templates.
    pub special_tokens: BTreeMap<String, String>,
    /// Chat templates by name (`default`, `tool_use`, …).
    templates: BTreeMap<String, ChatTemplate>,
}

impl Tokenizer {
    /// Loads `tokenizer.json`, `tokenizer_config.json` (optional) and `chat_template.jinja` (optional).
    pub fn load(dir: &Path) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(ModelError::Tokenizer {
                path,
                message: "missing; an HF tokenizer.json is required".into(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| ModelError::Tokenizer {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config: TokenizerConfigFile = if config_path.exists() {
            read_json(&config_path, "a tokenizer config")?
        } else {
            TokenizerConfigFile::default()
        };
        let mut special_tokens = BTreeMap::new();
        for (key, token) in [
            ("bos_token", config.bos_token),
            ("eos_token", config.eos_token),
            ("pad_token", config.pad_token),
            ("unk_token", config.unk_token),
        ] {
            if let Some(token) = token {
                special_tokens.insert(key.to_owned(), token.text());
            }
        }
        let mut sources: BTreeMap<String, (String, String)> = BTreeMap::new();
        match config.chat_template {
            Some(TemplateField::One(t)) => {
                sources.insert("default".into(), (t, config_path.display().to_string()));
            }
            Some(TemplateField::Named(list)) => {
                for t in list {
                    sources.insert(t.name, (t.template, config_path.display().to_string()));
                }
            }
            None => {}
        }
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            let text = std::fs::read_to_string(&jinja).map_err(ModelError::io(&jinja))?;
            sources.insert("default".into(), (text, jinja.display().to_string()));
        }
        let mut templates = BTreeMap::new();
        for (name, (source, origin)) in sources {
            templates.insert(
                name,
                ChatTemplate::new(&source, &origin, special_tokens.clone())?,
            );
        }
        Ok(Tokenizer {
            inner,
            path,
            special_tokens,
            templates,
        })
    }

    /// Wraps an in-memory tokenizer (for models being built).
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        special_tokens: BTreeMap<String, String>,
        template: Option<ChatTemplate>,
    ) -> Tokenizer {
        let templates = template
            .into_iter()
            .map(|t| ("default".to_owned(), t))
            .collect();
        Tokenizer {
            inner,
            path: PathBuf::from("<memory>"),
            special_tokens,
            templates,
        }
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The chat template transformers would pick: `tool_use` when tools are given and it exists,
    /// otherwise `default`.
    pub fn chat_template(&self, with_tools: bool) -> Result<&ChatTemplate> {
        if with_tools {
            if let Some(t) = self.templates.get("tool_use") {
                return Ok(t);
            }
        }
        self.templates.get("default").ok_or_else(|| ModelError::Tokenizer { path: self.path.clone(), message: "the tokenizer has no chat template (no chat_template in tokenizer_config.json and no chat_template.jinja)".into() })
    }

    /// Token ids of `text`; `add_special_tokens` applies the post-processor (BOS for Llama).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self.encode_with_offsets(text, add_special_tokens)?.ids)
    }

    /// Token ids and their byte ranges in `text`.
    pub fn encode_with_offsets(&self, text: &str, add_special_tokens: bool) -> Result<Encoding> {
        let enc =
            self.inner
                .encode(text, add_special_tokens)
                .map_err(|e| ModelError::Tokenizer {
                    path: self.path.clone(),
                    message: format!("encoding failed: {e}"),
                })?;
        Ok(Encoding {
            ids: enc.get_ids().to_vec(),
            offsets: enc.get_offsets().to_vec(),
        })
    }

    /// The tokens covering the byte range `start..end` of the text `offsets` came from: every token
    /// that overlaps it (a half-open token index range).
    pub fn token_range(
        offsets: &[(usize, usize)],
        start: usize,
        end: usize,
    ) -> std::ops::Range<usize> {
        let first = offsets
            .iter()
            .position(|&(_, e)| e > start)
            .unwrap_or(offsets.len());
        let last = offsets
            .iter()
            .rposition(|&(s, _)| s < end)
            .map_or(first, |i| i + 1);
        first..last.max(first)
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| ModelError::Tokenizer {
                path: self.path.clone(),
                message: format!("decoding failed: {e}"),
            })
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

#[cfg(test)]
mod tests {
    use super::Tokenizer;

    #[test]
    fn token_range_covers_overlapping_tokens() {
        let offsets = [(0, 3), (3, 5), (5, 9), (9, 10)];
        assert_eq!(Tokenizer::token_range(&offsets, 3, 9), 1..3);
        assert_eq!(Tokenizer::token_range(&offsets, 4, 6), 1..3);
        assert_eq!(Tokenizer::token_range(&offsets, 0, 10), 0..4);
        assert_eq!(Tokenizer::token_range(&offsets, 10, 10), 4..4);
    }
}
