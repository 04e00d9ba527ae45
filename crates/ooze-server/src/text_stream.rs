//! Incremental detokenisation for streaming: the text of a growing token sequence, extended by
//! decoding only a short window of recent tokens per new token (not the whole sequence), and
//! handed out in pieces that are safe to show — no half-decoded character, and, when tool calls are
//! expected, nothing that could be the start of a `<tool_call>` block.
//!
//! The window keeps the token before the new ones as context (`prefix..read`), so decoders that
//! treat the first token of a sequence specially (a leading space) decode the tail as they would
//! inside the full sequence; the new text is what `prefix..` decodes to beyond `prefix..read`.

use crate::tool_calls;
use ooze_model::Tokenizer;

pub struct TextStream {
    tokens: Vec<u32>,
    /// Start of the decoding window.
    prefix: usize,
    /// End of the tokens already turned into `text`.
    read: usize,
    text: String,
    /// Bytes of `text` already handed out.
    sent: usize,
    hold_tool_calls: bool,
    skip_special_tokens: bool,
}

impl TextStream {
    pub fn new(skip_special_tokens: bool, hold_tool_calls: bool) -> TextStream {
        TextStream {
            tokens: Vec::new(),
            prefix: 0,
            read: 0,
            text: String::new(),
            sent: 0,
            hold_tool_calls,
            skip_special_tokens,
        }
    }

    /// Adds a token; returns the text that became safe to show (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> String {
        self.tokens.push(token);
        let decode = |ids: &[u32]| {
            tokenizer
                .decode(ids, self.skip_special_tokens)
                .unwrap_or_default()
        };
        let before = decode(&self.tokens[self.prefix..self.read]);
        let after = decode(&self.tokens[self.prefix..]);
        match after.strip_prefix(before.as_str()) {
            // An incomplete character: wait for the next token.
            Some(new) if new.ends_with('\u{fffd}') => {}
            Some(new) => {
                self.text.push_str(new);
                self.prefix = self.read;
                self.read = self.tokens.len();
            }
            // The window decodes inconsistently (rare): fall back to the whole sequence.
            None => {
                let full = decode(&self.tokens);
                if !full.ends_with('\u{fffd}') {
                    self.text = full;
                    self.prefix = self.tokens.len().saturating_sub(1);
                    self.read = self.tokens.len();
                }
            }
        }
        let ready = if self.hold_tool_calls {
            tool_calls::safe_content_len(&self.text)
        } else {
            self.text.len()
        };
        let piece = self.text.get(self.sent..ready).unwrap_or("").to_owned();
        self.sent = self.sent.max(ready);
        piece
    }

    /// All text so far (complete characters only).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The text not handed out yet.
    pub fn rest(&self) -> &str {
        self.text.get(self.sent..).unwrap_or("")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tiny Qwen2-style tokenizer trained on ooze's corpus (the streaming tests' fixture).
    pub(crate) fn tokenizer() -> Tokenizer {
        let dir = tempfile::tempdir().unwrap();
        let mut options = ooze_model::init::InitOptions::new(
            ooze_model::Family::Qwen2,
            ooze_model::init::Size::Tiny,
        );
        options.tokenizer_vocab = 400;
        ooze_model::init::init_model(
            dir.path(),
            &ooze_model::corpus::generate(0, 20_000),
            &options,
        )
        .unwrap();
        Tokenizer::load(dir.path()).unwrap()
    }

    #[test]
    fn pieces_add_up_to_the_full_decode() {
        let tok = tokenizer();
        let text = "Zürich — 😀 <tool_call> is not here; answer: 42 \\boxed{7}";
        let ids = tok.encode(text, false).unwrap();
        let mut stream = TextStream::new(true, false);
        let pieces: String = ids.iter().map(|&t| stream.push(&tok, t)).collect();
        assert_eq!(pieces, tok.decode(&ids, true).unwrap());
        assert_eq!(stream.text(), pieces);
        assert_eq!(stream.rest(), "");
    }

    #[test]
    fn tool_call_blocks_are_held_back() {
        let tok = tokenizer();
        let ids = tok
            .encode(
                "Let me check. <tool_call>{\"name\": \"f\"}</tool_call>",
                false,
            )
            .unwrap();
        let mut stream = TextStream::new(true, true);
        let shown: String = ids.iter().map(|&t| stream.push(&tok, t)).collect();
        assert_eq!(shown, "Let me check. ");
        assert!(stream.rest().starts_with("<tool_call>"));
    }
}
