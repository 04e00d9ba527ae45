//! The server over real HTTP on loopback, with a tiny CPU model: SGLang and OpenAI shapes, errors,
//! streaming, control endpoints, and a load of 1,000 concurrent requests with aborts and
//! disconnects, after which every KV slot is free and the server still answers.

mod common;

use common::make_model;
use ooze_server::serve::ServeConfig;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The server as `ooze serve` runs it (timeouts, connection cap, shutdown handling).
async fn serve(dir: &Path, slots: i64) -> SocketAddr {
    common::start(dir, slots, ServeConfig::default()).await.addr
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.unwrap()
}

/// One HTTP/1.1 request; returns the status and the body (chunked bodies are returned raw).
async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let mut stream = connect(addr).await;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!("{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .await
        .unwrap_or_else(|e| panic!("{method} {path} {body}: {e}"));
    common::split_response(&raw)
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = http(addr, "POST", path, Some(&body)).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}")),
    )
}

async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    let (status, text) = http(addr, "GET", path, None).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_generate_shapes_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 1);
    let addr = serve(dir.path(), 8).await;
    let (status, out) = post(addr, "/generate", json!({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6, "temperature": 0}, "return_logprob": true, "rid": "r1"})).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["output_ids"].as_array().unwrap().len(), 6);
    let meta = &out["meta_info"];
    assert_eq!(
        (
            meta["id"].as_str(),
            meta["prompt_tokens"].as_u64(),
            meta["completion_tokens"].as_u64()
        ),
        (Some("r1"), Some(3), Some(6))
    );
    assert_eq!(
        meta["finish_reason"],
        json!({"type": "length", "length": 6})
    );
    let lps = meta["output_token_logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), 6);
    assert_eq!(lps[0][1], out["output_ids"][0]);
    assert!(lps[0][0].as_f64().unwrap() < 0.0);

    let (status, batch) = post(
        addr,
        "/generate",
        json!({"text": ["hello", "Question: Bob"], "sampling_params": {"max_new_tokens": 3}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(batch.as_array().unwrap().len(), 2);

    for (body, code, needle) in [
        (
            json!({"sampling_params": {}}),
            400,
            "`text` or `input_ids` is required",
        ),
        (
            json!({"input_ids": [1], "sampling_params": {"top_p": 2}}),
            400,
            "sampling_params.top_p: must be in (0, 1]",
        ),
        (
            json!({"input_ids": [1, 99999]}),
            400,
            "token id 99999, outside the vocabulary",
        ),
        (
            json!({"input_ids": [1], "sampling_params": {"max_new_tokens": 1024}}),
            400,
            "exceeds the engine's sequence length 1024",
        ),
        (json!({"input_ids": "oops"}), 400, "input_ids"),
    ] {
        let (status, err) = post(addr, "/generate", body.clone()).await;
        assert_eq!(status, code, "{body}: {err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {message}");
    }
    let (status, _) = http(addr, "POST", "/generate", None).await;
    assert_eq!(status, 400, "an empty body is a client error");
    // SGLang's router adds `model`; fields ooze does not act on (a misspelt one too) are
    // accepted and counted, so a router can route here.
    let (status, out) = post(
        addr,
        "/generate",
        json!({"model": "default", "input_ids": [1],
               "sampling_params": {"max_new_tokens": 2, "no_stop_trim": true, "temprature": 1}}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let (_, info) = get(addr, "/get_server_info").await;
    assert_eq!(
        info["ignored_fields"],
        json!({"model": 1, "sampling_params.temprature": 1})
    );
    let (status, err) = get(addr, "/no/such/path").await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_control_and_weight_updates() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 1);
    let other = tempfile::tempdir().unwrap();
    make_model(other.path(), 2);
    let addr = serve(dir.path(), 4).await;
    let (status, body) = http(
        addr,
        "POST",
        "/generate",
        Some(
            &json!({"input_ids": [3, 4], "stream": true, "sampling_params": {"max_new_tokens": 4}}),
        ),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body.matches("data: {").count(),
        5,
        "four cumulative chunks and the final one: {body}"
    );
    assert!(body.contains("data: [DONE]"));

    assert_eq!(get(addr, "/health").await.0, 200);
    assert_eq!(get(addr, "/health_generate").await.0, 200);
    assert_eq!(get(addr, "/get_model_info").await.1["is_generation"], true);
    let (_, info) = get(addr, "/get_server_info").await;
    // 4 sequences of 1024 tokens in blocks of 16, all free while nothing runs.
    assert_eq!(info["kv_block_size"], 16);
    assert_eq!(info["kv_blocks_total"], 256);
    assert_eq!(info["kv_blocks_free"], 256);
    assert_eq!(info["engine"]["max_running"], 4);
    assert_eq!(post(addr, "/flush_cache", json!({})).await.0, 200);
    assert_eq!(
        post(addr, "/release_memory_occupation", json!({})).await.0,
        200
    );
    assert_eq!(
        get(addr, "/get_server_info").await.1["engine"]["kv_allocated"],
        false
    );
    assert_eq!(
        post(addr, "/resume_memory_occupation", json!({})).await.0,
        200
    );

    let (_, before) = post(addr, "/generate", json!({"input_ids": [9, 9], "sampling_params": {"max_new_tokens": 4, "temperature": 0}, "return_logprob": true})).await;
    let (status, err) = post(
        addr,
        "/update_weights_from_disk",
        json!({"model_path": "/nonexistent"}),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    let (status, ok) = post(
        addr,
        "/update_weights_from_disk",
        json!({"model_path": other.path()}),
    )
    .await;
    assert_eq!(
        (status, ok["weight_version"].as_u64()),
        (200, Some(1)),
        "{ok}"
    );
    let (_, after) = post(addr, "/generate", json!({"input_ids": [9, 9], "sampling_params": {"max_new_tokens": 4, "temperature": 0}, "return_logprob": true})).await;
    assert_eq!(after["meta_info"]["weight_version"], 1);
    assert_ne!(
        after["meta_info"]["output_token_logprobs"],
        before["meta_info"]["output_token_logprobs"]
    );

    // Paused: a request waits; continue lets it finish.
    assert_eq!(post(addr, "/pause_generation", json!({})).await.0, 200);
    let waiting = tokio::spawn(async move {
        post(
            addr,
            "/generate",
            json!({"input_ids": [1], "sampling_params": {"max_new_tokens": 2}, "rid": "held"}),
        )
        .await
    });
    loop {
        let (_, info) = get(addr, "/get_server_info").await;
        if info["engine"]["waiting"] == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(post(addr, "/continue_generation", json!({})).await.0, 200);
    let (status, done) = waiting.await.unwrap();
    assert_eq!(
        (status, done["meta_info"]["completion_tokens"].as_u64()),
        (200, Some(2))
    );

    // Retracting pause: a running request is preempted and continues after continue_generation.
    let long = json!({"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 800, "ignore_eos": true, "seed": 3}});
    let (_, uninterrupted) = post(addr, "/generate", long.clone()).await;
    let running = tokio::spawn(async move { post(addr, "/generate", long).await });
    loop {
        let (_, info) = get(addr, "/get_server_info").await;
        if info["engine"]["running"] == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        post(addr, "/pause_generation", json!({"mode": "retract"}))
            .await
            .0,
        200
    );
    let (_, info) = get(addr, "/get_server_info").await;
    assert_eq!(info["engine"]["preempted"], 1, "{info}");
    assert_eq!(post(addr, "/continue_generation", json!({})).await.0, 200);
    let (status, resumed) = running.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(resumed["text"], uninterrupted["text"]);
    let (status, err) = post(addr, "/pause_generation", json!({"mode": "sleep"})).await;
    assert_eq!(status, 400);
    assert!(
        err["error"]["message"].as_str().unwrap().contains("mode"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_completions_and_chat() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 1);
    let addr = serve(dir.path(), 8).await;
    let (_, models) = get(addr, "/v1/models").await;
    assert_eq!(models["data"][0]["id"], "tiny");
    let (status, out) = post(addr, "/v1/completions", json!({"model": "tiny", "prompt": "Question:", "max_tokens": 5, "n": 2, "seed": 3, "logprobs": 1})).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["choices"].as_array().unwrap().len(), 2);
    assert_eq!(
        out["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert_eq!(out["usage"]["completion_tokens"], 10);
    let chat = json!({
        "model": "tiny", "max_tokens": 6, "logprobs": true, "seed": 1,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
                     {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "3 degrees"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    });
    let (status, out) = post(addr, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        out["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    assert!(
        out["usage"]["prompt_tokens"].as_u64().unwrap() > 20,
        "the template rendered tools and the tool result"
    );
    let mut stream = chat.clone();
    stream["stream"] = json!(true);
    stream["stream_options"] = json!({"include_usage": true});
    let (status, body) = http(addr, "POST", "/v1/chat/completions", Some(&stream)).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("\"role\":\"assistant\"")
            && body.contains("\"usage\"")
            && body.contains("data: [DONE]"),
        "{body}"
    );
    for (body, needle) in [
        (json!({"messages": []}), "messages: at least one message"),
        (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "n": 2, "stream": true}),
            "n: streaming supports n = 1",
        ),
        (
            json!({"messages": [{"role": "robot", "content": "x"}]}),
            "messages[0].role: expected one of",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}),
            "the JSON body at `max_tokens`: invalid type",
        ),
    ] {
        let (status, err) = post(addr, "/v1/chat/completions", body.clone()).await;
        assert!((400..500).contains(&status), "{body}: {status}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(needle),
            "{body}: {err}"
        );
    }
    // What agents send beside the fields ooze acts on is accepted, whatever the model's name, and
    // counted by field: never a 400. `model` counts too (three calls above name the served model).
    let agent_call = json!({
        "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x", "name": "me"}],
        "max_tokens": 2, "store": false, "metadata": {"task": "t"}, "presence_penalty": 0.5,
        "service_tier": "auto", "reasoning_effort": "low",
    });
    let (status, out) = post(addr, "/v1/chat/completions", agent_call.clone()).await;
    assert_eq!(status, 200, "{out}");
    post(addr, "/v1/chat/completions", agent_call).await;
    let (status, info) = get(addr, "/get_server_info").await;
    assert_eq!(status, 200);
    assert_eq!(
        info["ignored_fields"],
        json!({"metadata": 2, "model": 5, "presence_penalty": 2, "reasoning_effort": 2,
               "service_tier": 2, "store": 2})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_requests_with_aborts_leave_no_leak() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 1);
    let addr = serve(dir.path(), 32).await;
    let mut tasks = Vec::new();
    for i in 0..1000u64 {
        tasks.push(tokio::spawn(async move {
            let rid = format!("load-{i}");
            let body = json!({"input_ids": [1 + i % 300, 2, 3], "rid": rid, "sampling_params": {"max_new_tokens": 4 + i % 29, "seed": i, "ignore_eos": true}});
            match i % 5 {
                // Streams that the client abandons after the first bytes.
                0 => {
                    let mut stream = connect(addr).await;
                    let mut b = body.clone();
                    b["stream"] = json!(true);
                    let text = b.to_string();
                    let head = format!("POST /generate HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}", text.len());
                    stream.write_all(head.as_bytes()).await.unwrap();
                    let mut buf = [0u8; 64];
                    let _ = stream.read(&mut buf).await.unwrap();
                    "disconnected"
                }
                // Requests aborted by rid from another connection.
                1 => {
                    let request = tokio::spawn(async move { post(addr, "/generate", body).await });
                    let (status, _) = post(addr, "/abort_request", json!({"rid": rid})).await;
                    assert_eq!(status, 200);
                    let (status, out) = request.await.unwrap();
                    assert_eq!(status, 200, "{out}");
                    match out["meta_info"]["finish_reason"]["type"].as_str().unwrap() {
                        "abort" => "aborted",
                        "length" => "finished",
                        other => panic!("unexpected finish {other}"),
                    }
                }
                _ => {
                    let (status, out) = post(addr, "/generate", body).await;
                    assert_eq!(status, 200, "{out}");
                    assert_eq!(out["meta_info"]["completion_tokens"].as_u64(), Some(4 + i % 29));
                    "finished"
                }
            }
        }));
    }
    let mut outcomes = std::collections::BTreeMap::new();
    for task in tasks {
        *outcomes.entry(task.await.unwrap()).or_insert(0) += 1;
    }
    assert_eq!(outcomes.values().sum::<i32>(), 1000);
    assert!(
        outcomes.get("finished").copied().unwrap_or(0) >= 600,
        "{outcomes:?}"
    );
    // Abandoned streams are aborted when the engine next tries to send to them; wait for that.
    let mut info = Value::Null;
    for _ in 0..10_000 {
        info = get(addr, "/get_server_info").await.1;
        if info["kv_blocks_free"] == info["kv_blocks_total"]
            && info["engine"]["running"] == 0
            && info["engine"]["waiting"] == 0
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        info["kv_blocks_free"], info["kv_blocks_total"],
        "KV blocks leaked: {info}"
    );
    assert_eq!(info["kv_blocks_total"], 32 * 1024 / 16);
    assert_eq!(
        get(addr, "/health_generate").await.0,
        200,
        "the server still answers"
    );
    eprintln!("load outcomes: {outcomes:?}");
}
