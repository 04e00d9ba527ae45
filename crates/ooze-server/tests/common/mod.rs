//! Fixtures for the server tests: a tiny CPU model, a server on a loopback port, raw HTTP/1.1.
#![allow(dead_code)]

use ooze_engine::EngineConfig;
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family, Tokenizer};
use ooze_server::serve::{ServeConfig, Shutdown};
use ooze_server::AppState;
use ooze_torch::tch::{Device, Kind};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bounds every wait on the server, so a server that never answers fails the test instead of
/// hanging it. Not a performance threshold: everything it guards finishes in well under a second.
pub const GUARD: Duration = Duration::from_secs(60);

pub fn make_model(dir: &Path, seed: i64) {
    let mut options = InitOptions::new(Family::Qwen2, Size::Tiny);
    options.tokenizer_vocab = 400;
    options.seed = seed;
    init_model(dir, &ooze_model::corpus::generate(3, 30_000), &options).unwrap();
}

/// A running server: its address, its shutdown handle and the task serving it.
pub struct Server {
    pub addr: SocketAddr,
    pub shutdown: Shutdown,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
}

pub async fn start(dir: &Path, slots: i64, config: ServeConfig) -> Server {
    let decoder = Decoder::load(dir, Device::Cpu, Kind::Float).unwrap();
    let tokenizer = Arc::new(Tokenizer::load(dir).unwrap());
    let engine = ooze_engine::start(
        decoder,
        Some(tokenizer.clone()),
        EngineConfig::new(slots, 1024, vec![]),
    );
    let state = Arc::new(AppState::new(
        engine,
        tokenizer,
        "tiny".into(),
        dir.to_owned(),
        Duration::from_secs(60),
        json!({}),
    ));
    let listener = ooze_server::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = Shutdown::new();
    let handle = shutdown.clone();
    let task = tokio::spawn(async move {
        ooze_server::serve_app(listener, state, None, &config, &handle).await
    });
    Server {
        addr,
        shutdown,
        task,
    }
}

pub async fn guarded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer from the server within {GUARD:?}"))
}

/// A request's bytes, keeping the connection open.
pub fn request(method: &str, path: &str, body: Option<&Value>) -> Vec<u8> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    format!("{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// One response read off a kept-alive connection (content-length bodies only).
pub async fn read_response(stream: &mut TcpStream) -> (u16, Value) {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.unwrap();
        assert_eq!(n, 1, "the connection closed mid-head: {raw:?}");
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no content-length: {head}"));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    (
        head[9..12].parse().unwrap(),
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    )
}

/// Sends one request with `connection: close` and reads the whole reply: status and raw body.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!("{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    guarded(path, stream.read_to_end(&mut raw))
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    split_response(&raw)
}

pub fn split_response(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    assert!(text.len() >= 12, "not an HTTP response: {text:?}");
    let status = text[9..12].parse().unwrap();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

pub async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    let (status, text) = http(addr, "GET", path, None).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

pub async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = http(addr, "POST", path, Some(&body)).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}")),
    )
}

/// Waits until the server closes `stream`: end of file, or a reset.
pub async fn closed_by_server(stream: &mut TcpStream) {
    let mut sink = [0u8; 256];
    loop {
        match guarded("waiting for the server to close", stream.read(&mut sink)).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}
