//! Hostile and edge-case requests through the real router on loopback, with a tiny CPU model:
//! lengths that would wrap, temperatures that would give NaN, zero-token requests, malformed chat
//! messages and tools — each a 400 naming the field, or a well-defined answer — and SGLang's
//! prompt log-probs (`return_logprob` + `logprob_start_len`) checked against `ooze_model` scoring.

mod common;

use common::make_model;
use ooze_model::{score_sequences, Decoder, Layout, ScoreOptions};
use ooze_server::serve::ServeConfig;
use ooze_torch::tch::{Device, Kind};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn serve(dir: &Path) -> SocketAddr {
    common::start(dir, 4, ServeConfig::default()).await.addr
}

/// One POST; the status and the raw body (a panicking handler shows up as no response at all).
async fn post_raw(addr: SocketAddr, path: &str, body: &Value) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.to_string();
    let head = format!("POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    assert!(
        raw.len() > 12,
        "{path} {body}: no HTTP response: {:?}",
        String::from_utf8_lossy(&raw)
    );
    common::split_response(&raw)
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = post_raw(addr, path, &body).await;
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    (status, value)
}

/// Asserts a 400 whose message contains `needle`.
async fn refused(addr: SocketAddr, path: &str, body: Value, needle: &str) {
    let (status, err) = post(addr, path, body.clone()).await;
    let message = err["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(status, 400, "{body}: {err}");
    assert!(
        message.contains(needle),
        "{body}:\n{message}\nlacks: {needle}"
    );
}

fn chat(messages: Value) -> Value {
    json!({"messages": messages, "max_tokens": 2})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lengths_that_would_wrap_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 3);
    let addr = serve(dir.path()).await;
    for huge in [1u64 << 63, u64::MAX] {
        refused(
            addr,
            "/generate",
            json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": huge}}),
            &format!("sampling_params.max_new_tokens: must be in [0, 4294967295], got {huge}"),
        )
        .await;
        refused(
            addr,
            "/v1/completions",
            json!({"prompt": [1, 2, 3], "max_tokens": huge}),
            &format!("max_tokens: must be in [1, 4294967295], got {huge}"),
        )
        .await;
        refused(
            addr,
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": huge}),
            "max_completion_tokens: must be in [1, 4294967295]",
        )
        .await;
    }
    // Within the type's range but past the sequence: the allowed range for this prompt.
    refused(
        addr,
        "/generate",
        json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4000000000u64}}),
        "max_new_tokens must be in [0, 1021] for this prompt",
    )
    .await;
    let (status, err) = post(
        addr,
        "/v1/completions",
        json!({"prompt": [1, 2, 3], "max_tokens": 5000}),
    )
    .await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (400, Some("context_length_exceeded"))
    );
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("max_tokens: prompt (3 tokens) + max_tokens (5000)")
            && message.ends_with("max_tokens must be in [1, 1021] for this prompt"),
        "{message}"
    );
    refused(
        addr,
        "/v1/completions",
        json!({"prompt": [1, 2, 3], "min_tokens": 9, "max_tokens": 3}),
        "min_tokens: 9 exceeds max_new_tokens 3",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temperatures_are_checked_and_tiny_ones_give_finite_log_probs() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 3);
    let addr = serve(dir.path()).await;
    for t in [1e-300, 1e-7] {
        let (status, out) = post(addr, "/generate", json!({"input_ids": [4, 5, 6], "return_logprob": true, "sampling_params": {"temperature": t, "max_new_tokens": 5, "ignore_eos": true}})).await;
        assert_eq!(status, 200, "{out}");
        for entry in out["meta_info"]["output_token_logprobs"]
            .as_array()
            .unwrap()
        {
            let lp = entry[0].as_f64();
            assert!(
                lp.is_some_and(|lp| lp.is_finite() && lp <= 0.0),
                "T {t}: {entry}"
            );
        }
        let (status, out) = post(
            addr,
            "/v1/completions",
            json!({"prompt": [4, 5, 6], "temperature": t, "max_tokens": 3, "logprobs": 1}),
        )
        .await;
        assert_eq!(status, 200, "{out}");
        let lps = &out["choices"][0]["logprobs"]["token_logprobs"];
        assert!(
            lps.as_array().unwrap().iter().all(|lp| lp.is_f64()),
            "{lps}"
        );
    }
    refused(
        addr,
        "/generate",
        json!({"input_ids": [1], "sampling_params": {"temperature": -0.5}}),
        "sampling_params.temperature: must be a finite number ≥ 0 (0 = greedy), got -0.5",
    )
    .await;
    refused(
        addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "temperature": -1}),
        "temperature: must be a finite number ≥ 0",
    )
    .await;
    refused(
        addr,
        "/v1/completions",
        json!({"prompt": "x", "top_p": 0}),
        "top_p: must be in (0, 1], got 0",
    )
    .await;
    refused(
        addr,
        "/v1/completions",
        json!({"prompt": "x", "top_k": -3}),
        "top_k: must be ≥ 0 (or -1 for off)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_tokens_mean_none_for_sglang_and_an_error_for_openai() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 3);
    let addr = serve(dir.path()).await;
    let (status, out) = post(
        addr,
        "/generate",
        json!({"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 0}}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["output_ids"], json!([]));
    assert_eq!(out["text"], "");
    assert_eq!(out["meta_info"]["completion_tokens"], 0);
    assert_eq!(
        out["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 0})
    );
    refused(
        addr,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 0}),
        "max_tokens: must be ≥ 1, got 0",
    )
    .await;
    refused(
        addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}),
        "max_completion_tokens: must be ≥ 1, got 0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_messages_and_tools_are_checked_by_shape() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 3);
    let addr = serve(dir.path()).await;
    let path = "/v1/chat/completions";
    let user = json!({"role": "user", "content": "hi"});
    for (messages, needle) in [
        (
            json!([user, {"role": "assistant", "content": 5}]),
            "messages[1].content: expected a string or a list of text parts (null only with tool_calls), got 5",
        ),
        (
            json!([{"role": "user", "content": {"text": "x"}}]),
            "messages[0].content: expected a string or a list of text parts, got {\"text\":\"x\"}",
        ),
        (
            json!([{"role": "user"}]),
            "messages[0].content: expected a string or a list of text parts, got nothing",
        ),
        (
            json!([user, {"role": "assistant", "content": null}]),
            "messages[1].content: expected a string or a list of text parts (null only with tool_calls), got null",
        ),
        (
            json!([{"role": 3, "content": "x"}]),
            "messages[0].role: expected one of \"system\", \"developer\", \"user\", \"assistant\", \"tool\", got 3",
        ),
        (
            json!([{"role": "robot", "content": "x"}]),
            "messages[0].role: expected one of",
        ),
        (json!(["hello"]), "messages[0]: expected an object"),
        (
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
            "messages[0].content[0]: expected a text part",
        ),
        (
            json!([user, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}]),
            "messages[1].tool_calls[0].function.name: expected a non-empty string, got nothing",
        ),
        (
            json!([user, {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": 7}}]}]),
            "messages[1].tool_calls[0].function.arguments: expected a JSON object, or a string holding one, got 7",
        ),
        (
            json!([{"role": "user", "content": "x", "tool_calls": []}]),
            "messages[0].tool_calls: expected no tool_calls (only assistant messages make tool calls)",
        ),
        (
            json!([user, {"role": "tool", "tool_call_id": 4, "content": "x"}]),
            "messages[1].tool_call_id: expected a string, got 4",
        ),
    ] {
        refused(addr, path, chat(messages), needle).await;
    }
    // Accepted shapes: developer (as system), text parts, an assistant tool call with null
    // content and string arguments, a tool result.
    let ok = json!([
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "3 degrees"}
    ]);
    let (status, out) = post(addr, path, chat(ok.clone())).await;
    assert_eq!(status, 200, "{out}");

    let tool = |function: Value| json!({"type": "function", "function": function});
    for (tools, needle) in [
        (
            json!([tool(json!({"parameters": {"type": "object"}}))]),
            "tools[0].function.name: expected a non-empty string, got nothing",
        ),
        (
            json!([tool(json!({"name": ""}))]),
            "tools[0].function.name: expected a non-empty string, got \"\"",
        ),
        (
            json!([tool(json!({"name": "f", "parameters": 5}))]),
            "tools[0].function.parameters: expected a JSON schema object, got 5",
        ),
        (
            json!([tool(json!({"name": "f"})), {"type": "retrieval", "function": {"name": "g"}}]),
            "tools[1].type: expected \"function\", got \"retrieval\"",
        ),
        (
            json!([{"function": {"name": "g"}}]),
            "tools[0].type: expected \"function\", got nothing",
        ),
        (
            json!([{"type": "function"}]),
            "tools[0].function: expected an object",
        ),
        (
            json!([tool(json!({"name": "f"})), tool(json!({"name": "f"}))]),
            "tools[1].function.name: \"f\" is already the name of tools[0]",
        ),
        (json!([7]), "tools[0]: expected an object"),
    ] {
        let mut body = chat(json!([user]));
        body["tools"] = tools;
        refused(addr, path, body, needle).await;
    }
    let mut body = chat(json!([user]));
    body["tools"] = json!([tool(json!({"name": "f", "parameters": {"type": "object"}}))]);
    body["tool_choice"] = json!({"type": "function", "function": {"name": "g"}});
    refused(
        addr,
        path,
        body.clone(),
        "tool_choice.function.name: \"g\" is not among the request's tools",
    )
    .await;
    body["tool_choice"] = json!("sometimes");
    refused(addr, path, body.clone(), "tool_choice: expected \"none\"").await;
    body["tool_choice"] = json!("auto");
    let (status, out) = post(addr, path, body).await;
    assert_eq!(status, 200, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_token_logprobs_equal_ooze_model_scoring() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 3);
    let addr = serve(dir.path()).await;
    let scorer = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let ids: Vec<u32> = (0..40).map(|j| (j * 17 + 5) % 390 + 1).collect();
    let reference = |temperature: f64| {
        let _guard = ooze_torch::tch::no_grad_guard();
        let options = ScoreOptions {
            temperature,
            ..ScoreOptions::default()
        };
        score_sequences(
            &scorer,
            std::slice::from_ref(&ids),
            Layout::Padded,
            &options,
        )
        .unwrap()[0]
            .log_probs
            .clone()
    };
    // A teacher's call: no new tokens, every prompt token scored at the request's temperature.
    for (temperature, scale) in [(None, 1.0), (Some(0.8), 0.8), (Some(0.0), 1.0)] {
        for start in [0usize, 10] {
            let mut sampling = json!({"max_new_tokens": 0});
            if let Some(t) = temperature {
                sampling["temperature"] = json!(t);
            }
            let (status, out) = post(addr, "/generate", json!({"input_ids": ids, "sampling_params": sampling, "return_logprob": true, "logprob_start_len": start})).await;
            assert_eq!(status, 200, "{out}");
            let meta = &out["meta_info"];
            assert_eq!(meta["output_token_logprobs"], json!([]));
            let entries = meta["input_token_logprobs"].as_array().unwrap();
            assert_eq!(entries.len(), ids.len() - start, "{meta}");
            assert_eq!(entries[0], json!([null, ids[start], null]), "as SGLang");
            let want = reference(scale);
            for (k, entry) in entries.iter().enumerate().skip(1) {
                let position = start + k;
                assert_eq!(entry[1], ids[position]);
                let got = entry[0].as_f64().unwrap();
                let expected = want[position - 1] as f64;
                assert!(
                    (got - expected).abs() <= 1e-4,
                    "T {scale}, token {position}: {got} vs {expected}"
                );
            }
        }
    }
    // Default start (-1): the last prompt token only; with generated tokens and texts.
    let (status, out) = post(addr, "/generate", json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "ignore_eos": true}, "return_logprob": true, "return_text_in_logprobs": true})).await;
    assert_eq!(status, 200, "{out}");
    let meta = &out["meta_info"];
    let last = ids[ids.len() - 1];
    assert_eq!(meta["input_token_logprobs"].as_array().unwrap().len(), 1);
    let entry = &meta["input_token_logprobs"][0];
    assert_eq!((&entry[0], &entry[1]), (&Value::Null, &json!(last)));
    assert!(entry[2].is_string(), "return_text_in_logprobs: {entry}");
    assert_eq!(meta["output_token_logprobs"].as_array().unwrap().len(), 3);
    // Streaming: the last chunk carries the prompt log-probs.
    let (status, body) = post_raw(addr, "/generate", &json!({"input_ids": ids, "stream": true, "sampling_params": {"max_new_tokens": 2}, "return_logprob": true, "logprob_start_len": 0})).await;
    assert_eq!(status, 200);
    let last_chunk = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .rfind(|d| d.starts_with('{'))
        .unwrap();
    let last_chunk: Value = serde_json::from_str(last_chunk).unwrap();
    assert_eq!(
        last_chunk["meta_info"]["input_token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        ids.len()
    );
    // Starts outside the prompt.
    refused(
        addr,
        "/generate",
        json!({"input_ids": [1, 2, 3], "return_logprob": true, "logprob_start_len": 3}),
        "logprob_start_len 3 must be below the prompt length 3",
    )
    .await;
    refused(
        addr,
        "/generate",
        json!({"input_ids": [1, 2, 3], "return_logprob": true, "logprob_start_len": -2}),
        "logprob_start_len: must be ≥ 0, or -1",
    )
    .await;
    refused(
        addr,
        "/generate",
        json!({"input_ids": [[1, 2], [3, 4]], "return_logprob": true, "logprob_start_len": [0]}),
        "logprob_start_len has 1 entries for 2 prompts",
    )
    .await;
}
