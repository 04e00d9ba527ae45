//! The agent gateway: OpenAI- and Anthropic-compatible endpoints scoped per session, so that a
//! program ooze does not run itself (a Python agent, an agent framework, a coding CLI) can be
//! trained token-exactly.
//!
//! - A session is one execution of the agent. It is named by the API key the program sends
//!   (`Authorization: Bearer KEY` or `x-api-key: KEY`) or by a path prefix `/s/{session}/…`; an
//!   unknown one gets 401 in the API's own error shape.
//! - Endpoints, each also under `/s/{session}`: `GET /v1/models`; OpenAI Chat Completions
//!   `POST /v1/chat/completions` ([`chat`]); OpenAI Responses `POST /v1/responses`
//!   ([`responses`]); Anthropic Messages `POST /v1/messages` ([`messages`], errors in
//!   Anthropic's shape). Each converts its request into one [`session::ChatCall`] (OpenAI chat
//!   form) and the reply into its own wire shape. Any `model` name is served by the policy.
//!   Fields ooze does not act on are ignored, never a 400, and counted per session
//!   (`gateway/ignored_field/NAME`).
//! - Each call goes through its session ([`session::Session`]): the history is rendered with the
//!   policy's chat template, generated turns keep their exact tokens, and the calls grow samples
//!   or start siblings ([`ooze_rollout::transcript`]). The recipe's sampling settings hold
//!   whatever the agent sends.
//! - `ooze train` opens and closes sessions itself ([`Gateway::open`], [`Gateway::close`]); for
//!   interactive use (`ooze serve --gateway`) `POST /gateway/sessions` opens one,
//!   `GET /gateway/sessions/{id}` shows its samples and `DELETE` closes it.

pub mod chat;
mod events;
pub mod messages;
pub mod responses;
pub mod session;
mod tools;

use crate::error::ApiError;
use crate::lenient_json::IgnoredFields;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ooze_core::Sample;
use ooze_model::Tokenizer;
use serde_json::{json, Value};
use session::{Budget, Session, SessionRecord};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The API family of an endpoint: errors are written in its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    OpenAi,
    Anthropic,
}

/// An error of a gateway endpoint, in its API's shape.
#[derive(Debug)]
pub struct GatewayError {
    pub api: Api,
    pub error: ApiError,
}

impl GatewayError {
    pub fn openai(error: ApiError) -> GatewayError {
        GatewayError {
            api: Api::OpenAi,
            error,
        }
    }

    /// The body: OpenAI's `{"error": {"message", "type", "code"}}` or Anthropic's
    /// `{"type": "error", "error": {"type", "message"}}`.
    pub fn body(&self) -> Value {
        match self.api {
            Api::OpenAi => self.error.body(),
            Api::Anthropic => {
                let kind = match self.error.status().as_u16() {
                    400 | 408 | 409 => "invalid_request_error",
                    401 => "authentication_error",
                    403 => "permission_error",
                    404 => "not_found_error",
                    429 => "rate_limit_error",
                    503 => "overloaded_error",
                    _ => "api_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": self.error.message}})
            }
        }
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        (self.error.status(), Json(self.body())).into_response()
    }
}

/// The sessions of one gateway.
pub struct Gateway {
    pub tokenizer: Arc<Tokenizer>,
    /// Reported by `/v1/models`; any name a request gives is served by the policy.
    pub model_name: String,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Ignored request fields over every session.
    pub ignored_fields: IgnoredFields,
    /// How sessions opened over HTTP answer (`ooze serve --gateway`); `None` refuses them.
    pub interactive: Option<Interactive>,
}

/// What a session opened over HTTP generates with.
pub struct Interactive {
    pub engine: ooze_engine::EngineHandle,
    pub sampling: ooze_engine::Sampling,
    pub limits: ooze_rollout::agent::AgentLimits,
    /// Where its call logs go (`DIR/SESSION.jsonl`), if anywhere.
    pub log_dir: Option<PathBuf>,
}

/// A fresh unguessable session token.
pub fn new_token() -> String {
    let mut bytes = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if filled.is_err() {
        // No /dev/urandom: time and a counter (unique, if guessable).
        let unique = format!("{:0>32}", crate::new_rid());
        bytes.copy_from_slice(&unique.as_bytes()[..16]);
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("ooze-{hex}")
}

impl Gateway {
    pub fn new(tokenizer: Arc<Tokenizer>, model_name: String) -> Gateway {
        Gateway {
            tokenizer,
            model_name,
            sessions: Mutex::new(HashMap::new()),
            ignored_fields: IgnoredFields::default(),
            interactive: None,
        }
    }

    /// Opens session `id` answering with `ctx` within `budget`, its calls logged to `log`.
    pub fn open(
        &self,
        id: String,
        ctx: ooze_rollout::agent::AgentContext,
        budget: Budget,
        log: Option<PathBuf>,
    ) -> std::io::Result<Arc<Session>> {
        let session = Arc::new(Session::new(id.clone(), ctx, budget, log)?);
        let mut sessions = self.sessions.lock().expect("never poisoned");
        if sessions.contains_key(&id) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("gateway session {id} is already open"),
            ));
        }
        sessions.insert(id, session.clone());
        Ok(session)
    }

    /// Closes session `id`: new calls get 401, calls still generating are aborted (their partial
    /// turns kept, finish `abort`), and its samples and metrics are returned.
    pub async fn close(&self, id: &str) -> Option<SessionRecord> {
        let session = self.sessions.lock().expect("never poisoned").remove(id)?;
        if session.in_flight() > 0 {
            session.context().cancel_token().cancel();
            let waited = tokio::time::Instant::now();
            while session.in_flight() > 0 && waited.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Some(session.record())
    }

    /// Drops session `id` without waiting for its calls (its record is lost): for an execution
    /// that is itself being dropped.
    pub fn discard(&self, id: &str) {
        if let Some(session) = self.sessions.lock().expect("never poisoned").remove(id) {
            session.context().cancel_token().cancel();
        }
    }

    /// Open sessions.
    pub fn len(&self) -> usize {
        self.sessions.lock().expect("never poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The session a request names: the `/s/{session}` prefix, else the API key.
    pub fn session_of(
        &self,
        in_path: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<Arc<Session>, ApiError> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let key = in_path
            .or_else(|| {
                header("authorization").map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim())
            })
            .or_else(|| header("x-api-key").map(str::trim));
        let Some(key) = key.filter(|k| !k.is_empty()) else {
            return Err(ApiError {
                code: "invalid_api_key",
                message: "no session: send the session's token as the API key (Authorization: Bearer or x-api-key) or call under /s/{session}/".into(),
            });
        };
        self.sessions
            .lock()
            .expect("never poisoned")
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError {
                code: "invalid_api_key",
                message: format!(
                    "no open gateway session {}: it was never opened or has ended",
                    shorten(key)
                ),
            })
    }

    /// The session a request names and its body as `T` (see [`Gateway::session_of`] and
    /// [`Gateway::parse`]): the preamble of every endpoint.
    pub fn request<T: serde::de::DeserializeOwned>(
        &self,
        in_path: Option<&Path<String>>,
        headers: &HeaderMap,
        body: &Bytes,
    ) -> Result<(Arc<Session>, T), ApiError> {
        let session = self.session_of(in_path.map(|p| p.0.as_str()), headers)?;
        let request = self.parse(&session, body)?;
        Ok((session, request))
    }

    /// The request body as `T`; the fields the gateway ignored are counted for the session and
    /// the gateway.
    pub fn parse<T: serde::de::DeserializeOwned>(
        &self,
        session: &Session,
        body: &Bytes,
    ) -> Result<T, ApiError> {
        let (value, ignored) = crate::lenient_json::parse::<T>(body)?;
        self.count_ignored(session, &ignored);
        Ok(value)
    }

    /// Counts request fields not acted on, for `session` and the whole gateway.
    pub fn count_ignored(&self, session: &Session, names: &[String]) {
        if !names.is_empty() {
            session.count_ignored(names);
            self.ignored_fields.count(names);
        }
    }
}

/// A key shown in an error: enough to recognise, not the whole secret.
fn shorten(key: &str) -> String {
    let shown: String = key.chars().take(12).collect();
    if shown.len() < key.len() {
        format!("{shown}…")
    } else {
        shown
    }
}

/// The gateway's endpoints, at the root and under `/s/{session}`.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/s/{session}/v1/models", get(models))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route(
            "/s/{session}/v1/chat/completions",
            post(chat::chat_completions),
        )
        .route("/v1/responses", post(responses::responses))
        .route("/s/{session}/v1/responses", post(responses::responses))
        .route("/v1/messages", post(messages::messages))
        .route("/s/{session}/v1/messages", post(messages::messages))
        .route("/gateway/sessions", post(open_session))
        .route(
            "/gateway/sessions/{session}",
            get(show_session).delete(close_session),
        )
        .route("/gateway/health", get(|| async { "ok" }))
        .with_state(gateway)
}

async fn models(State(gateway): State<Arc<Gateway>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [
        {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "ooze"}
    ]}))
}

/// `POST /gateway/sessions` body: all optional.
#[derive(serde::Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct OpenSession {
    session: Option<String>,
    max_calls: Option<usize>,
    max_tokens: Option<usize>,
    deadline_secs: Option<f64>,
    seed: Option<u64>,
}

async fn open_session(
    State(gateway): State<Arc<Gateway>>,
    body: Bytes,
) -> Result<Json<Value>, GatewayError> {
    let fail = GatewayError::openai;
    let Some(interactive) = &gateway.interactive else {
        return Err(fail(ApiError {
            code: "not_found",
            message: "sessions are opened by the run that owns this gateway".into(),
        }));
    };
    let req: OpenSession = if body.is_empty() {
        OpenSession::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| fail(ApiError::invalid(format!("the session request: {e}"))))?
    };
    let mut limits = interactive.limits.clone();
    if let Some(secs) = req.deadline_secs {
        if !(secs > 0.0 && secs.is_finite()) {
            return Err(fail(ApiError::invalid(format!(
                "deadline_secs: must be a positive number of seconds, got {secs}"
            ))));
        }
        limits.deadline = Duration::from_secs_f64(secs);
    }
    let id = match req.session {
        Some(id) if id.is_empty() || id.contains('/') => {
            return Err(fail(ApiError::invalid(
                "session: must be a non-empty name without `/`",
            )))
        }
        Some(id) => id,
        None => new_token(),
    };
    let ctx = ooze_rollout::agent::AgentContext::new(
        interactive.engine.clone(),
        gateway.tokenizer.clone(),
        interactive.sampling.clone(),
        limits,
        req.seed.unwrap_or_else(unix_nanos),
        Default::default(),
    );
    let log = interactive
        .log_dir
        .as_ref()
        .map(|d| d.join(format!("{id}.jsonl")));
    let budget = Budget {
        max_calls: req.max_calls,
        max_tokens: req.max_tokens,
    };
    gateway.open(id.clone(), ctx, budget, log).map_err(|e| {
        fail(ApiError {
            code: if e.kind() == std::io::ErrorKind::AlreadyExists {
                "busy"
            } else {
                "internal"
            },
            message: e.to_string(),
        })
    })?;
    Ok(Json(json!({"session": id})))
}

fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A sample as JSON: its tokens, masks and log-probs, and its text.
pub fn sample_json(tokenizer: &Tokenizer, sample: &Sample) -> Value {
    json!({
        "tokens": sample.tokens,
        "prompt_length": sample.prompt_length(),
        "loss_mask": sample.loss_mask,
        "rollout_log_probs": sample.rollout_log_probs,
        "text": tokenizer.decode(&sample.tokens, false).unwrap_or_default(),
        "status": format!("{:?}", sample.status),
    })
}

async fn show_session(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, GatewayError> {
    let session = gateway
        .session_of(Some(&id), &HeaderMap::new())
        .map_err(GatewayError::openai)?;
    let samples: Vec<Value> = session
        .snapshot()
        .iter()
        .map(|s| sample_json(&gateway.tokenizer, s))
        .collect();
    Ok(Json(json!({"session": id, "samples": samples})))
}

async fn close_session(
    State(gateway): State<Arc<Gateway>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, GatewayError> {
    let record = gateway.close(&id).await.ok_or_else(|| {
        GatewayError::openai(ApiError {
            code: "not_found",
            message: format!("no open gateway session {}", shorten(&id)),
        })
    })?;
    let samples: Vec<Value> = record
        .samples
        .iter()
        .map(|s| sample_json(&gateway.tokenizer, s))
        .collect();
    Ok(Json(
        json!({"session": id, "samples": samples, "metrics": record.metrics}),
    ))
}
