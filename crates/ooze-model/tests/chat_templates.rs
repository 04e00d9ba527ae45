//! Chat templates and tokenisation against transformers, on the official Qwen2.5, Qwen3 and
//! Llama 3.1 tokenizer files: rendered text byte-identical, token ids equal, the same exceptions.

mod common;

use common::*;
use ooze_model::{ModelError, RenderOptions, Tokenizer};
use std::collections::BTreeMap;

fn options(case: &serde_json::Value) -> RenderOptions {
    RenderOptions {
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
        tools: case["tools"].as_array().cloned(),
        kwargs: case["kwargs"].as_object().cloned().unwrap_or_default(),
    }
}

/// The reference conversations that transformers rendered (not the ones its template rejected).
fn rendered_cases(cases: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    cases
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.get("text").is_some())
}

fn tokenizers() -> BTreeMap<String, Tokenizer> {
    ["qwen2.5", "qwen3", "llama3.1"]
        .iter()
        .map(|f| {
            (
                f.to_string(),
                Tokenizer::load(&hf_data_dir().join(f)).unwrap(),
            )
        })
        .collect()
}

#[test]
fn rendering_is_byte_identical_to_transformers() {
    let cases = read_json(&reference_dir().join("chat_cases.json"));
    let cases = cases.as_array().unwrap();
    let toks = tokenizers();
    let mut rendered = 0;
    for case in cases {
        let family = case["family"].as_str().unwrap();
        let name = format!("{family} / {}", case["name"].as_str().unwrap());
        let tok = &toks[family];
        let opts = options(case);
        let messages = case["messages"].as_array().unwrap();
        let result = tok
            .chat_template(opts.tools.is_some())
            .unwrap()
            .render(messages, &opts);
        match case.get("error") {
            Some(err) => match result {
                Err(ModelError::TemplateRaised { message, .. }) => {
                    assert_eq!(&message, err.as_str().unwrap(), "{name}")
                }
                other => panic!("{name}: expected the template to raise `{err}`, got {other:?}"),
            },
            None => {
                let text = result.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(
                    text,
                    case["text"].as_str().unwrap(),
                    "{name}: rendered text differs"
                );
                assert_eq!(
                    tok.encode(&text, false).unwrap(),
                    u32s(&case["ids"]),
                    "{name}: token ids differ"
                );
                rendered += 1;
            }
        }
    }
    assert!(rendered >= 12, "only {rendered} conversations rendered");
}

#[test]
fn assistant_spans_cover_each_assistant_turn() {
    let cases = read_json(&reference_dir().join("chat_cases.json"));
    let toks = tokenizers();
    let mut checked = 0;
    for case in rendered_cases(&cases) {
        let family = case["family"].as_str().unwrap();
        let name = format!("{family} / {}", case["name"].as_str().unwrap());
        let opts = RenderOptions {
            add_generation_prompt: false,
            ..options(case)
        };
        let template = toks[family].chat_template(opts.tools.is_some()).unwrap();
        let messages = case["messages"].as_array().unwrap();
        let full = template.render(messages, &opts).unwrap();
        let spans = template
            .assistant_spans(messages, &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let assistants: Vec<usize> = messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m["role"] == "assistant")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            spans.iter().map(|s| s.message).collect::<Vec<_>>(),
            assistants,
            "{name}"
        );
        let end_token = if family == "llama3.1" {
            "<|eot_id|>"
        } else {
            "<|im_end|>"
        };
        for (i, span) in spans.iter().enumerate() {
            let text = &full[span.start..span.end];
            let content = messages[span.message]["content"].as_str().unwrap_or("");
            let visible = content.rsplit("</think>").next().unwrap().trim();
            // (Llama 3.1 drops the text of a message that has tool calls; then nothing to find.)
            if full.contains(visible) {
                assert!(
                    text.contains(visible),
                    "{name}: span {text:?} lacks {visible:?}"
                );
            }
            assert!(
                text.ends_with(end_token),
                "{name}: span {text:?} does not end the turn"
            );
            assert!(
                !text.contains("<|im_start|>assistant")
                    && !text.contains("<|start_header_id|>assistant"),
                "{name}: span {text:?} includes the generation prompt"
            );
            if i > 0 {
                assert!(span.start >= spans[i - 1].end, "{name}: spans overlap");
            }
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} spans checked");
}

#[test]
fn continuation_tokens_equal_what_the_whole_render_adds() {
    // A multi-turn agent: the policy's turn ends at its stop token; the environment appends a tool
    // result and the next generation prompt. Token-exact: prefix tokens ++ delta tokens == whole.
    let cases = read_json(&reference_dir().join("chat_cases.json"));
    let toks = tokenizers();
    let mut checked = 0;
    for case in rendered_cases(&cases) {
        let family = case["family"].as_str().unwrap();
        let messages = case["messages"].as_array().unwrap();
        let Some(cut) = messages.iter().rposition(|m| m["role"] == "assistant") else {
            continue;
        };
        if cut + 1 == messages.len() {
            continue;
        }
        let name = format!("{family} / {}", case["name"].as_str().unwrap());
        let opts = RenderOptions {
            add_generation_prompt: true,
            ..options(case)
        };
        let tok = &toks[family];
        let template = tok.chat_template(opts.tools.is_some()).unwrap();
        let (previous, added) = messages.split_at(cut + 1);
        let plain = RenderOptions {
            add_generation_prompt: false,
            ..opts.clone()
        };
        let prefix_text = template.render(previous, &plain).unwrap();
        let end = template
            .assistant_spans(previous, &plain)
            .unwrap()
            .last()
            .unwrap()
            .end;
        let whole = template.render(messages, &opts).unwrap();
        let delta = match template.continuation(previous, added, &opts) {
            Ok(delta) => delta,
            Err(err) => {
                // Only allowed when it is true: Qwen3 re-renders the last turn once a user speaks.
                assert!(
                    !whole.starts_with(&prefix_text[..end]),
                    "{name}: continuation refused wrongly: {err}"
                );
                assert_eq!(family, "qwen3", "{name}: {err}");
                continue;
            }
        };
        let mut ids = tok.encode(&prefix_text[..end], false).unwrap();
        ids.extend(tok.encode(&delta, false).unwrap());
        assert_eq!(
            ids,
            tok.encode(&whole, false).unwrap(),
            "{name}: prefix + delta tokens differ from the whole conversation"
        );
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} continuations checked");
}

#[test]
fn tokenization_matches_the_python_tokenizers() {
    let reference = read_json(&reference_dir().join("tokenization.json"));
    let toks = tokenizers();
    for (family, texts) in reference.as_object().unwrap() {
        let tok = &toks[family];
        for t in texts.as_array().unwrap() {
            let text = t["text"].as_str().unwrap();
            assert_eq!(
                tok.encode(text, false).unwrap(),
                u32s(&t["ids"]),
                "{family}: {text:?}"
            );
            assert_eq!(
                tok.encode(text, true).unwrap(),
                u32s(&t["ids_special"]),
                "{family} with special tokens: {text:?}"
            );
            assert_eq!(
                tok.decode(&u32s(&t["ids"]), false).unwrap(),
                t["decoded"].as_str().unwrap(),
                "{family} decode: {text:?}"
            );
        }
    }
}
