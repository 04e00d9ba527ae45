//! `ooze serve` as a user runs it, driven by the official `openai` Python package and behind
//! SGLang's router (`sglang-router`): a random model for the API surface, and a scripted model
//! that answers every chat with a tool call, so the `tool_calls` path is exercised end to end
//! (generated text → parser → response → client).

mod common;

use ooze_model::checkpoint::{save_weights, SaveOptions};
use ooze_model::init::{init_model, random_weights, InitOptions, Size};
use ooze_model::{Family, ModelConfig, Tokenizer};
use ooze_torch::tch::{Kind, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `ooze serve` as these tests run it.
fn serve(model: &Path) -> (common::Server, String) {
    common::serve(model, &["--context-len", "1024", "--max-running", "8"])
}

/// Runs one of the Python client checks against `url`.
fn client_check(script: &str, url: &str) {
    client_check_with(script, &[url]);
}

/// Runs one of the Python client checks with `args`.
fn client_check_with(script: &str, args: &[&str]) {
    let python = std::env::var_os("OOZE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"));
    let out = Command::new(python)
        .arg(root().join("scripts/reference").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn openai_python_client_works_against_ooze_serve() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-chat");
    let status = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args([
            "init-model",
            "--family",
            "qwen3",
            "--tokenizer-vocab",
            "500",
        ])
        .arg(&model)
        .status()
        .unwrap();
    assert!(status.success());
    let (_server, url) = serve(&model);
    client_check("openai_client_check.py", &url);
}

/// SGLang's own router, from the Python package index, routes `/generate` and
/// `/v1/chat/completions` to `ooze serve` (it adds SGLang's fields to what it forwards, which the
/// server accepts and counts as ignored).
#[test]
fn sglang_router_routes_to_ooze_serve() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-chat");
    common::ooze_ok(&[
        "init-model",
        "--family",
        "qwen2",
        "--size",
        "tiny",
        model.to_str().unwrap(),
    ]);
    let (_server, url) = serve(&model);
    client_check("sglang_router_check.py", &url);
}

/// The call the scripted model makes.
const TOOL_CALL: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;

/// A tiny Qwen2 model that is a pure bigram chain: attention and MLP outputs are zero, so the
/// logits depend on the current token only, and each token of
/// `\n → <tool_call> → TOOL_CALL → </tool_call> → <|im_end|>` predicts the next one by a wide
/// margin. The chat template's generation prompt ends in `\n`, so every chat is answered with the
/// tool call. TOOL_CALL is one added token (the chain needs distinct tokens).
fn scripted_tool_model(dir: &Path) {
    let mut options = InitOptions::new(Family::Qwen2, Size::Tiny);
    options.tokenizer_vocab = 500;
    options.vocab_size = Some(512);
    options.tie_word_embeddings = false;
    init_model(dir, &ooze_model::corpus::generate(5, 30_000), &options).unwrap();

    let path = dir.join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let next_id = Tokenizer::load(dir).unwrap().vocab_size();
    assert!(next_id < 512, "room for the added token");
    tokenizer["added_tokens"].as_array_mut().unwrap().push(
        serde_json::json!({"id": next_id, "content": TOOL_CALL, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": false}),
    );
    std::fs::write(&path, tokenizer.to_string()).unwrap();

    let tokenizer = Tokenizer::load(dir).unwrap();
    let id = |text: &str| {
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(ids.len(), 1, "{text:?} is one token");
        ids[0] as usize
    };
    let chain = [
        id("\n"),
        id("<tool_call>"),
        id(TOOL_CALL),
        id("</tool_call>"),
        id("<|im_end|>"),
    ];
    let config = ModelConfig::load(dir).unwrap();
    let (vocab, hidden) = (config.vocab_size as usize, config.hidden_size as usize);
    assert!(chain.len() < hidden);
    let mut embed = vec![0f32; vocab * hidden];
    let mut head = vec![0f32; vocab * hidden];
    for (i, pair) in chain.windows(2).enumerate() {
        // Token pair[0] is the unit vector e_i; the head maps e_i to token pair[1].
        embed[pair[0] * hidden + i] = 1.0;
        head[pair[1] * hidden + i] = 4.0;
    }
    let matrix = |values: &[f32]| Tensor::from_slice(values).view([vocab as i64, hidden as i64]);
    let weights: Vec<(String, Tensor)> = random_weights(&config, 1)
        .into_iter()
        .map(|(name, t)| {
            let t = if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
                t.zeros_like()
            } else if name == "model.embed_tokens.weight" {
                matrix(&embed)
            } else if name == "lm_head.weight" {
                matrix(&head)
            } else {
                t
            };
            (name, t)
        })
        .collect();
    save_weights(
        dir,
        &weights,
        SaveOptions {
            max_shard_bytes: 1 << 30,
            kind: Kind::Float,
        },
    )
    .unwrap();
}

#[test]
fn tool_calls_reach_the_openai_client() {
    let dir = tempfile::tempdir().unwrap();
    scripted_tool_model(dir.path());
    let (_server, url) = serve(dir.path());
    client_check("openai_tool_call_check.py", &url);
}

/// The agent gateway's Chat Completions, driven by the `openai` client through a tool loop (plain,
/// streamed, with log-probs): the session's sample decodes exactly to Hugging Face's rendering of
/// the conversation as the model wrote it, its trained tokens and log-probs are the ones the calls
/// returned, and another system prompt starts a sibling (scripts/reference/gateway_chat_check.py).
#[test]
fn gateway_chat_samples_are_token_exact() {
    let dir = tempfile::tempdir().unwrap();
    scripted_tool_model(dir.path());
    let (_server, url) = common::serve(
        dir.path(),
        &["--context-len", "1024", "--max-running", "8", "--gateway"],
    );
    client_check_with(
        "gateway_chat_check.py",
        &[&url, dir.path().to_str().unwrap()],
    );
}
