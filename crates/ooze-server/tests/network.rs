//! The server under hostile network load and at shutdown, over real HTTP on loopback through
//! `serve_app`: half-open and idle clients are closed after the header timeout while `/health`
//! answers; connections over the cap get a 503 at once; a body that stops arriving gets a 408;
//! shutdown answers new requests with 503 and ends open streams with a final `abort` event and
//! `[DONE]`, then the server exits.

mod common;

use common::{
    closed_by_server, get, guarded, make_model, post, read_response, request, split_response,
    sse_events, start,
};
use ooze_server::serve::{Phase, ServeConfig};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_and_idle_clients_are_closed_while_health_answers() {
    ooze_server::fd_limit::raise_open_file_limit().unwrap();
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 1);
    let config = ServeConfig {
        header_read_timeout: Duration::from_millis(500),
        max_connections: 1_000,
        ..ServeConfig::default()
    };
    let server = start(dir.path(), 4, config).await;
    let addr = server.addr;
    // 200 send half a request head and stop; 200 send nothing.
    let mut clients = Vec::new();
    for i in 0..400 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        if i % 2 == 0 {
            client
                .write_all(b"POST /generate HTTP/1.1\r\nhost: te")
                .await
                .unwrap();
        }
        clients.push(client);
    }
    let (status, body) = get(addr, "/health").await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));
    for client in &mut clients {
        closed_by_server(client).await;
    }
    let (status, body) = get(addr, "/health").await;
    assert_eq!((status, body), (200, json!({"status": "ok"})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_get_503_and_health_recovers() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 1);
    let config = ServeConfig {
        max_connections: 8,
        ..ServeConfig::default()
    };
    let server = start(dir.path(), 4, config).await;
    let addr = server.addr;
    // Each held connection has been served a request, so it certainly holds its place.
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(&request("GET", "/health", None))
            .await
            .unwrap();
        assert_eq!(
            guarded("held /health", read_response(&mut conn)).await.0,
            200
        );
        held.push(conn);
    }
    for _ in 0..50 {
        let (status, err) = get(addr, "/health").await;
        assert_eq!(status, 503, "{err}");
        assert_eq!(err["error"]["code"], "unavailable", "{err}");
        assert_eq!(err["error"]["type"], "server_error", "{err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains("8 connections open"), "{message}");
    }
    drop(held);
    // The server sees the held connections close on its own time; /health answers once it has.
    let mut answered = false;
    for _ in 0..1_000 {
        if get(addr, "/health").await.0 == 200 {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        answered,
        "/health never answered after the held connections closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_gets_408_and_the_connection_closes() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 1);
    let config = ServeConfig {
        body_read_timeout: Duration::from_millis(300),
        ..ServeConfig::default()
    };
    let server = start(dir.path(), 4, config).await;
    for path in ["/generate", "/v1/chat/completions"] {
        let mut conn = TcpStream::connect(server.addr).await.unwrap();
        let head = format!("POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"input_ids\"");
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        guarded(path, conn.read_to_end(&mut raw)).await.unwrap();
        let (status, body) = split_response(&raw);
        let err: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(status, 408, "{path}: {err}");
        assert_eq!(err["error"]["code"], "request_timeout", "{path}: {err}");
    }
    assert_eq!(get(server.addr, "/health").await.0, 200);
}

/// The streaming endpoints and a request body for each.
fn streams() -> [(&'static str, Value); 3] {
    [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 50}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hello", "stream": true, "max_tokens": 50}),
        ),
        (
            "/generate",
            json!({"text": "hello", "stream": true, "sampling_params": {"max_new_tokens": 50}}),
        ),
    ]
}

/// Opens a stream and waits for its status line: by then the request is in the engine.
async fn open_stream(addr: std::net::SocketAddr, path: &str, body: &Value) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(&request("POST", path, Some(body)))
        .await
        .unwrap();
    let mut status = [0u8; 12];
    guarded(path, conn.read_exact(&mut status)).await.unwrap();
    assert_eq!(&status, b"HTTP/1.1 200", "{path}");
    conn
}

/// Reads a stream to its end and checks it closed with an `abort` event and `[DONE]`.
async fn assert_ends_with_abort(path: &str, conn: &mut TcpStream) {
    let mut raw = Vec::new();
    guarded(path, conn.read_to_end(&mut raw)).await.unwrap();
    let events = sse_events(&String::from_utf8_lossy(&raw));
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{path}: {events:?}"
    );
    assert!(events.len() >= 2, "{path}: {events:?}");
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    let finish = if path == "/generate" {
        &last["meta_info"]["finish_reason"]["type"]
    } else {
        &last["choices"][0]["finish_reason"]
    };
    assert_eq!(finish, "abort", "{path}: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refuses_new_requests_and_ends_open_streams_with_abort() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 1);
    let config = ServeConfig {
        shutdown_drain: Duration::from_secs(600),
        ..ServeConfig::default()
    };
    let server = start(dir.path(), 4, config).await;
    let addr = server.addr;
    // Paused in place, the engine holds every request: the streams are still open at shutdown.
    let (status, _) = post(addr, "/pause_generation", json!({"mode": "in_place"})).await;
    assert_eq!(status, 200);
    let mut open = Vec::new();
    for (path, body) in streams() {
        open.push((path, open_stream(addr, path, &body).await));
    }
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(&request("GET", "/health", None))
        .await
        .unwrap();
    assert_eq!(
        guarded("idle /health", read_response(&mut idle)).await.0,
        200
    );

    assert_eq!(server.shutdown.trigger(), Phase::Draining);
    closed_by_server(&mut idle).await;
    let (status, err) = get(addr, "/health").await;
    assert_eq!(
        (status, &err["error"]["code"], &err["error"]["type"]),
        (503, &json!("unavailable"), &json!("server_error")),
        "{err}"
    );
    let (status, err) = post(
        addr,
        "/generate",
        json!({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    assert_eq!(status, 503, "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("shutting down"));

    // A second trigger ends the drain: the running streams are aborted.
    assert_eq!(server.shutdown.trigger(), Phase::Aborting);
    for (path, conn) in &mut open {
        assert_ends_with_abort(path, conn).await;
    }
    guarded("server exit", server.task).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_period_ends_with_running_streams_aborted() {
    let dir = tempfile::tempdir().unwrap();
    make_model(dir.path(), 1);
    let config = ServeConfig {
        shutdown_drain: Duration::from_millis(200),
        ..ServeConfig::default()
    };
    let server = start(dir.path(), 4, config).await;
    let (status, _) = post(
        server.addr,
        "/pause_generation",
        json!({"mode": "in_place"}),
    )
    .await;
    assert_eq!(status, 200);
    let [(path, body), ..] = streams();
    let mut conn = open_stream(server.addr, path, &body).await;
    assert_eq!(server.shutdown.trigger(), Phase::Draining);
    assert_ends_with_abort(path, &mut conn).await;
    guarded("server exit", server.task).await.unwrap().unwrap();
}
