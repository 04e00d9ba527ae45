//! ooze-server: the embedded engine over HTTP.
//!
//! - SGLang-compatible: `POST /generate`, `GET /health`, `/health_generate`, `/get_model_info`,
//!   `/get_server_info`, `POST /flush_cache`, `/abort_request`, `/pause_generation`,
//!   `/continue_generation`, `/update_weights_from_disk`, `/release_memory_occupation`,
//!   `/resume_memory_occupation` ([`sglang`]).
//! - OpenAI-compatible: `GET /v1/models`, `POST /v1/completions`, `/v1/chat/completions` with tools
//!   and streaming ([`openai`]); vLLM's extensions trainers use (`return_token_ids`,
//!   `return_tokens_as_token_ids`, `stop_reason`) and its development endpoints
//!   `/collective_rpc` (`reload_weights`) and `/reset_prefix_cache` ([`vllm_dev`]).
//!
//! - The agent gateway: the OpenAI and Anthropic APIs per session, recording token-exact samples of
//!   programs ooze does not run itself ([`gateway`]).
//!
//! Every request has a deadline; a client that goes away aborts its generation (the engine notices
//! the closed stream); errors have one JSON shape ([`error::ApiError`]). [`serve_app`] serves the
//! router with header and body read timeouts, a connection cap and a graceful shutdown
//! ([`serve`]).

pub mod error;
pub mod fd_limit;
pub mod gateway;
pub mod lenient_json;
pub mod openai;
pub mod serve;
pub mod sglang;
pub mod text_stream;
pub mod timed_body;
pub mod tool_calls;
pub mod vllm_dev;
pub mod weight_groups;

use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use ooze_engine::{EngineHandle, Event, Output, Request, RequestId};
use ooze_model::Tokenizer;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A submitted request: its id and its event stream.
pub type Submitted = (RequestId, tokio::sync::mpsc::UnboundedReceiver<Event>);

/// What the handlers share.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    /// Name reported by `/v1/models` and in replies; any `model` a request names is served by it.
    pub model_name: String,
    pub model_path: PathBuf,
    /// A request still running after this long is aborted.
    pub request_timeout: Duration,
    /// Engine settings reported by `/get_server_info`.
    pub server_info: serde_json::Value,
    /// Request fields ooze does not act on, counted by path (`/get_server_info` reports them).
    pub ignored_fields: lenient_json::IgnoredFields,
    /// Weight update groups a trainer formed with this engine (SGLang's distributed update).
    pub weight_groups: weight_groups::WeightGroups,
    rids: Mutex<HashMap<String, RequestId>>,
}

impl AppState {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<Tokenizer>,
        model_name: String,
        model_path: PathBuf,
        request_timeout: Duration,
        server_info: serde_json::Value,
    ) -> AppState {
        AppState {
            engine,
            tokenizer,
            model_name,
            model_path,
            request_timeout,
            server_info,
            ignored_fields: Default::default(),
            weight_groups: weight_groups::WeightGroups::new(ooze_torch::tch::Device::Cpu),
            rids: Mutex::new(HashMap::new()),
        }
    }

    /// The device the engine's weights are on (where distributed weight updates arrive).
    pub fn with_weights_on(mut self, device: ooze_torch::tch::Device) -> AppState {
        self.weight_groups = weight_groups::WeightGroups::new(device);
        self
    }

    fn register(&self, rid: &str, id: RequestId) -> RidGuard<'_> {
        self.rids
            .lock()
            .expect("invariant: no panics while holding the rid map")
            .insert(rid.to_owned(), id);
        RidGuard {
            state: self,
            rid: rid.to_owned(),
        }
    }

    /// Aborts the request registered under `rid`; false if none is running.
    pub fn abort_rid(&self, rid: &str) -> bool {
        let id = self
            .rids
            .lock()
            .expect("invariant: no panics while holding the rid map")
            .get(rid)
            .copied();
        if let Some(id) = id {
            self.engine.abort(id);
        }
        id.is_some()
    }
}

struct RidGuard<'a> {
    state: &'a AppState,
    rid: String,
}

impl Drop for RidGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.state.rids.lock() {
            map.remove(&self.rid);
        }
    }
}

/// A fresh request id.
pub fn new_rid() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:04x}",
        nanos & 0xffff_ffff_ffff,
        NEXT.fetch_add(1, Ordering::Relaxed) & 0xffff
    )
}

/// Submits `request` and follows its events, calling `on_token` for each token, until it is done.
/// The deadline aborts it (the output then says abort); `rid` makes it abortable by name.
pub async fn run_request(
    state: &AppState,
    request: Request,
    rid: &str,
    on_token: impl FnMut(u32, f32) -> bool,
) -> Result<Output, ApiError> {
    let submitted = state.engine.submit(request)?;
    follow(state, submitted, rid, on_token).await
}

/// Follows an already submitted request (see [`run_request`]). `on_token` returning false aborts it.
pub async fn follow(
    state: &AppState,
    submitted: Submitted,
    rid: &str,
    mut on_token: impl FnMut(u32, f32) -> bool,
) -> Result<Output, ApiError> {
    let (id, mut events) = submitted;
    let _registration = state.register(rid, id);
    let deadline = tokio::time::sleep(state.request_timeout);
    tokio::pin!(deadline);
    let mut aborted = false;
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(Event::Token { token, log_prob }) => {
                    if !on_token(token, log_prob) && !aborted {
                        state.engine.abort(id);
                        aborted = true;
                    }
                }
                Some(Event::Done(output)) => return Ok(output),
                None => return Err(ApiError { code: "unavailable", message: "the engine stopped".into() }),
            },
            () = &mut deadline, if !aborted => {
                state.engine.abort(id);
                aborted = true;
            }
        }
    }
}

/// A listening socket with a deep accept queue: bursts of thousands of connections (a rollout
/// starting all its requests at once) must wait to be accepted, not be reset by the kernel.
pub fn listen(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

/// [`listen`] on the first address `host` resolves to; errors name the host and port.
pub async fn listen_on(host: &str, port: u16) -> std::io::Result<tokio::net::TcpListener> {
    let named = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{host}:{port}: {e}"));
    let addr = tokio::net::lookup_host((host, port))
        .await
        .map_err(named)?
        .next()
        .ok_or_else(|| named(std::io::Error::other("resolves to no address")))?;
    listen(addr).map_err(named)
}

/// The sending side of a server-sent-event stream.
pub type SseSender =
    tokio::sync::mpsc::Sender<Result<axum::response::sse::Event, std::convert::Infallible>>;

/// Sends a chunk, waiting for room (for the last chunks of a stream).
pub async fn send_json(tx: &SseSender, value: &serde_json::Value) {
    let _ = tx
        .send(Ok(
            axum::response::sse::Event::default().data(value.to_string())
        ))
        .await;
}

/// Queues a chunk without waiting; false once the client is gone. A full queue (a slow client)
/// drops the chunk: the stream's last chunk still carries everything not yet shown.
pub fn try_send_json(tx: &SseSender, value: &serde_json::Value) -> bool {
    !matches!(
        tx.try_send(Ok(
            axum::response::sse::Event::default().data(value.to_string())
        )),
        Err(tokio::sync::mpsc::error::TrySendError::Closed(_))
    )
}

/// Serves every endpoint of `state` on `listener` (see [`serve::serve`]) until `shutdown` has run
/// its course; when the drain is over, every running generation is aborted, so open streams end
/// with a final event (finish reason `abort`) and `[DONE]`. With a `gateway`, its endpoints take
/// the place of the plain OpenAI ones (every call then belongs to a session).
pub async fn serve_app(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    gateway: Option<Arc<gateway::Gateway>>,
    config: &serve::ServeConfig,
    shutdown: &serve::Shutdown,
) -> std::io::Result<()> {
    let engine = state.engine.clone();
    let app = match gateway {
        Some(gateway) => sglang_routes(state).merge(gateway::router(gateway)),
        None => build_app(state),
    };
    serve::serve(listener, app, config, shutdown, move || engine.abort_all()).await
}

/// The router with every endpoint.
pub fn build_app(state: Arc<AppState>) -> Router {
    sglang_routes(state.clone()).merge(
        Router::new()
            .route("/v1/models", get(openai::models))
            .route("/v1/completions", post(openai::completions))
            .route("/v1/chat/completions", post(openai::chat_completions))
            .route("/collective_rpc", post(vllm_dev::collective_rpc))
            .route("/reset_prefix_cache", post(vllm_dev::reset_prefix_cache))
            .with_state(state),
    )
}

/// SGLang's endpoints, and the JSON 404 of every path no route takes.
fn sglang_routes(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(sglang::health))
        .route("/health_generate", get(sglang::health_generate))
        .route("/get_model_info", get(sglang::model_info))
        .route("/get_server_info", get(sglang::server_info))
        .route("/generate", post(sglang::generate))
        .route("/flush_cache", post(sglang::flush_cache))
        .route("/abort_request", post(sglang::abort_request))
        .route("/pause_generation", post(sglang::pause))
        .route("/continue_generation", post(sglang::resume))
        .route(
            "/update_weights_from_disk",
            post(sglang::update_weights_from_disk),
        )
        .route(
            "/init_weights_update_group",
            post(weight_groups::init_weights_update_group),
        )
        .route(
            "/update_weights_from_distributed",
            post(weight_groups::update_weights_from_distributed),
        )
        .route(
            "/destroy_weights_update_group",
            post(weight_groups::destroy_weights_update_group),
        )
        .route("/release_memory_occupation", post(sglang::release_memory))
        .route("/resume_memory_occupation", post(sglang::resume_memory))
        .fallback(|| async {
            ApiError {
                code: "not_found",
                message: "no such endpoint".into(),
            }
        })
        .with_state(state)
}
