//! The agent gateway's Anthropic Messages and OpenAI Responses endpoints, as `ooze serve --gateway`
//! serves them, driven by the official Python SDKs (`anthropic`, `openai`, `openai-agents`):
//! on the scripted model that answers every chat with a tool call, tool loops whose calls are sent
//! back and must grow one sample token-exactly, decoding to the model's own chat template's rendering of
//! the same conversation (and errors in each API's shape); on a random tiny
//! model, plain and streamed text.

mod common;

use std::path::Path;

/// `ooze serve --gateway` on `model`; returns it with its root URL (no `/v1`).
fn serve_gateway(model: &Path) -> (common::Server, String) {
    let (server, url) = common::serve(
        model,
        &["--context-len", "1024", "--max-running", "8", "--gateway"],
    );
    let root = url.strip_suffix("/v1").unwrap_or(&url).to_owned();
    (server, root)
}

/// Runs `scripts/reference/SCRIPT ROOT MODE [ARGS]`.
fn sdk_check(script: &str, root: &str, mode: &str, args: &[&str]) {
    let all: Vec<&str> = [root, mode]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    common::reference_check(script, &all);
}

#[test]
fn anthropic_and_responses_tool_loops_grow_one_sample() {
    let dir = tempfile::tempdir().unwrap();
    common::scripted_tool_model(dir.path());
    let (_server, root) = serve_gateway(dir.path());
    let model = dir.path().to_str().unwrap();
    sdk_check("anthropic_gateway_check.py", &root, "tools", &[model]);
    sdk_check("openai_responses_check.py", &root, "tools", &[model]);
}

#[test]
fn anthropic_and_responses_stream_text() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::tiny_model(dir.path());
    let (_server, root) = serve_gateway(&model);
    sdk_check("anthropic_gateway_check.py", &root, "text", &[]);
    sdk_check("openai_responses_check.py", &root, "text", &[]);
}
