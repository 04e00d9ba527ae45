//! `ooze serve` as a user runs it, driven by the official `openai` Python package and behind
//! SGLang's router (`sglang-router`): a random model for the API surface, and a scripted model
//! that answers every chat with a tool call, so the `tool_calls` path is exercised end to end
//! (generated text → parser → response → client).

mod common;

use std::path::Path;
use std::process::Command;

/// `ooze serve` as these tests run it.
fn serve(model: &Path) -> (common::Server, String) {
    common::serve(model, &["--context-len", "1024", "--max-running", "8"])
}

/// Runs one of the Python client checks against `url`.
fn client_check(script: &str, url: &str) {
    common::reference_check(script, &[url]);
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
    let model = common::tiny_model(dir.path());
    let (_server, url) = serve(&model);
    client_check("sglang_router_check.py", &url);
}

#[test]
fn tool_calls_reach_the_openai_client() {
    let dir = tempfile::tempdir().unwrap();
    common::scripted_tool_model(dir.path());
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
    common::scripted_tool_model(dir.path());
    let (_server, url) = common::serve(
        dir.path(),
        &["--context-len", "1024", "--max-running", "8", "--gateway"],
    );
    common::reference_check(
        "gateway_chat_check.py",
        &[&url, dir.path().to_str().unwrap()],
    );
}
