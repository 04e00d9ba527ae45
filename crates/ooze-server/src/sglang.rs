//! SGLang-compatible endpoints: the shapes routers and RL frameworks written for SGLang send and
//! expect (`/generate` with `input_ids` or `text`, `sampling_params`, `return_logprob`, `meta_info`).
//!
//! Log-probs (`return_logprob: true`), as SGLang gives them: `meta_info.output_token_logprobs` and
//! `meta_info.input_token_logprobs`, lists of `[logprob, token_id, text]` (text null unless
//! `return_text_in_logprobs`). The input list covers prompt positions `logprob_start_len ..`
//! (default -1: the last prompt token only); its first entry's log-prob is always null (the token
//! at `logprob_start_len` is where scoring starts), the others are `log_softmax(logits / T)` of each
//! prompt token given the ones before it, T the request's temperature (1 for greedy) — the
//! definition of the output log-probs. With `max_new_tokens: 0` the prompt is only scored (a
//! distillation teacher's call). A stream carries the input list in its last chunk only.

use crate::error::ApiError;
use crate::lenient_json::LenientJson;
use crate::text_stream::TextStream;
use crate::{follow, new_rid, run_request, try_send_json, AppState};
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ooze_core::{FinishReason, StopMatch};
use ooze_engine::{Output, PauseMode, Request, SamplingParams};
use ooze_model::Tokenizer;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    fn into_vec(self) -> (Vec<T>, bool) {
        match self {
            OneOrMany::One(x) => (vec![x], false),
            OneOrMany::Many(v) => (v, true),
        }
    }
}

/// `POST /generate` body.
#[derive(Deserialize)]
pub struct GenerateRequest {
    text: Option<OneOrMany<String>>,
    input_ids: Option<OneOrMany<Vec<u32>>>,
    #[serde(default)]
    sampling_params: SamplingParams,
    #[serde(default)]
    return_logprob: bool,
    #[serde(default)]
    stream: bool,
    rid: Option<OneOrMany<String>>,
    /// Where `input_token_logprobs` start in each prompt (one value for all prompts, or one per
    /// prompt); -1 (the default) for the last prompt token only.
    logprob_start_len: Option<OneOrMany<i64>>,
    top_logprobs_num: Option<usize>,
    #[serde(default)]
    return_text_in_logprobs: bool,
}

/// Each prompt's `logprob_start_len`, checked against nothing but its sign (the engine checks it
/// against the prompt length).
fn logprob_starts(
    given: Option<OneOrMany<i64>>,
    prompts: &[Vec<u32>],
) -> Result<Vec<usize>, ApiError> {
    let given = match given {
        None => vec![-1; prompts.len()],
        Some(OneOrMany::One(s)) => vec![s; prompts.len()],
        Some(OneOrMany::Many(v)) if v.len() == prompts.len() => v,
        Some(OneOrMany::Many(v)) => {
            return Err(ApiError::invalid(format!(
                "logprob_start_len has {} entries for {} prompts",
                v.len(),
                prompts.len()
            )))
        }
    };
    given
        .into_iter()
        .zip(prompts)
        .map(|(start, prompt)| match start {
            -1 => Ok(prompt.len().saturating_sub(1)),
            s => usize::try_from(s).map_err(|_| {
                ApiError::invalid(format!(
                    "logprob_start_len: must be ≥ 0, or -1 for the last prompt token only, got {s}"
                ))
            }),
        })
        .collect()
}

pub fn finish_reason_json(finish: &FinishReason, completion_tokens: usize) -> Value {
    match finish {
        FinishReason::Stop {
            matched: StopMatch::Token(t),
        } => json!({"type": "stop", "matched": t}),
        FinishReason::Stop {
            matched: StopMatch::Text(s),
        } => json!({"type": "stop", "matched": s}),
        FinishReason::Length => json!({"type": "length", "length": completion_tokens}),
        FinishReason::Abort => json!({"type": "abort", "message": "aborted"}),
    }
}

/// What shapes a `/generate` reply besides the tokens.
#[derive(Clone)]
struct Reply {
    rid: String,
    prompt: Vec<u32>,
    /// `logprob_start_len` when log-probs are returned.
    logprob_start: Option<usize>,
    text_in_logprobs: bool,
    skip_special: bool,
}

/// `[logprob, token_id, text]` entries, SGLang's log-prob shape.
fn logprob_entries<'a>(
    tokenizer: &Tokenizer,
    with_text: bool,
    entries: impl Iterator<Item = (Option<f32>, &'a u32)>,
) -> Value {
    entries
        .map(|(lp, &t)| {
            let text = with_text.then(|| tokenizer.decode(&[t], false).unwrap_or_default());
            json!([lp, t, text])
        })
        .collect()
}

fn response_json(
    reply: &Reply,
    tokenizer: &Tokenizer,
    text: &str,
    tokens: &[u32],
    log_probs: &[f32],
    out: Option<&Output>,
) -> Value {
    let mut meta = json!({
        "id": reply.rid,
        "finish_reason": out.map(|o| finish_reason_json(&o.finish, o.tokens.len())),
        "prompt_tokens": reply.prompt.len(),
        "completion_tokens": tokens.len(),
        "cached_tokens": out.map_or(0, |o| o.cached_tokens),
        "weight_version": out.map(|o| o.weight_version),
    });
    if let Some(start) = reply.logprob_start {
        let with_text = reply.text_in_logprobs;
        meta["output_token_logprobs"] = logprob_entries(
            tokenizer,
            with_text,
            log_probs.iter().map(|&lp| Some(lp)).zip(tokens),
        );
        if let Some(out) = out {
            // Null where nothing was computed: the first entry, and every entry of a request
            // aborted before its prefill.
            let scores = std::iter::once(None)
                .chain(out.prompt_log_probs.iter().map(|&lp| Some(lp)))
                .chain(std::iter::repeat(None));
            let ids = reply.prompt.get(start..).unwrap_or_default();
            meta["input_token_logprobs"] = logprob_entries(tokenizer, with_text, scores.zip(ids));
        }
    }
    json!({"text": text, "output_ids": tokens, "meta_info": meta})
}

pub async fn generate(
    State(state): State<Arc<AppState>>,
    LenientJson(req): LenientJson<GenerateRequest>,
) -> Result<Response, ApiError> {
    if req.top_logprobs_num.unwrap_or(0) > 0 {
        return Err(ApiError::invalid("top_logprobs_num: top log-probs are not supported; ooze returns the chosen tokens' log-probs"));
    }
    let (prompts, batched) = match (req.input_ids, req.text) {
        (Some(ids), None) => ids.into_vec(),
        (None, Some(text)) => {
            let (texts, batched) = text.into_vec();
            let ids = texts
                .iter()
                .map(|t| state.tokenizer.encode(t, true))
                .collect::<Result<Vec<_>, _>>()?;
            (ids, batched)
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "give either `text` or `input_ids`, not both",
            ))
        }
        (None, None) => return Err(ApiError::invalid("`text` or `input_ids` is required")),
    };
    let rids: Vec<String> = match req.rid {
        Some(r) => {
            let (rids, _) = r.into_vec();
            if rids.len() != prompts.len() {
                return Err(ApiError::invalid(format!(
                    "rid has {} entries for {} prompts",
                    rids.len(),
                    prompts.len()
                )));
            }
            rids
        }
        None => prompts.iter().map(|_| new_rid()).collect(),
    };
    let sampling = req.sampling_params.validate()?;
    let skip_special = sampling.skip_special_tokens;
    let starts: Vec<Option<usize>> = if req.return_logprob {
        logprob_starts(req.logprob_start_len, &prompts)?
            .into_iter()
            .map(Some)
            .collect()
    } else {
        vec![None; prompts.len()]
    };
    let replies = prompts
        .into_iter()
        .zip(rids)
        .zip(starts)
        .map(|((prompt, rid), start)| Reply {
            rid,
            prompt,
            logprob_start: start,
            text_in_logprobs: req.return_text_in_logprobs,
            skip_special,
        });
    if req.stream {
        let mut replies: Vec<Reply> = replies.collect();
        if batched || replies.len() != 1 {
            return Err(ApiError::invalid("stream: streaming takes one prompt"));
        }
        let reply = replies.remove(0);
        return Ok(stream(state, sampling, reply).await?.into_response());
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, reply) in replies.enumerate() {
        let state = state.clone();
        let sampling = sampling.clone();
        tasks.spawn(async move {
            let submitted = submit(&state, &reply, sampling)?;
            let out = follow(&state, submitted, &reply.rid, |_, _| true).await?;
            Ok::<_, ApiError>((
                i,
                response_json(
                    &reply,
                    &state.tokenizer,
                    &state.tokenizer.decode(&out.tokens, reply.skip_special)?,
                    &out.tokens,
                    &out.log_probs,
                    Some(&out),
                ),
            ))
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        results.push(joined.map_err(|e| ApiError {
            code: "internal",
            message: e.to_string(),
        })??);
    }
    results.sort_by_key(|(i, _)| *i);
    let mut values: Vec<Value> = results.into_iter().map(|(_, v)| v).collect();
    Ok(Json(if batched {
        Value::Array(values)
    } else {
        values.remove(0)
    })
    .into_response())
}

/// Submits one prompt of a `/generate` call, scoring its prompt when log-probs are asked for.
fn submit(
    state: &AppState,
    reply: &Reply,
    sampling: ooze_engine::Sampling,
) -> Result<crate::Submitted, ApiError> {
    let request = Request {
        input_ids: reply.prompt.clone(),
        sampling,
        session: None,
    };
    Ok(match reply.logprob_start {
        Some(start) => state.engine.submit_with_prompt_log_probs(request, start)?,
        None => state.engine.submit(request)?,
    })
}

async fn stream(
    state: Arc<AppState>,
    sampling: ooze_engine::Sampling,
    reply: Reply,
) -> Result<Sse<tokio_stream::wrappers::ReceiverStream<Result<SseEvent, Infallible>>>, ApiError> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    // Submitted before the stream starts, so bad input is a plain 4xx.
    let submitted = submit(&state, &reply, sampling)?;
    tokio::spawn(async move {
        let (mut tokens, mut log_probs) = (Vec::new(), Vec::new());
        let mut text = TextStream::new(reply.skip_special, false);
        let st = state.clone();
        let result = follow(&state, submitted, &reply.rid, |token, lp| {
            tokens.push(token);
            log_probs.push(lp);
            text.push(&st.tokenizer, token);
            let chunk = response_json(
                &reply,
                &st.tokenizer,
                text.text(),
                &tokens,
                &log_probs,
                None,
            );
            // A slow client misses chunks, not text: they are cumulative.
            try_send_json(&tx, &chunk)
        })
        .await;
        let last = match result {
            Ok(out) => response_json(
                &reply,
                &state.tokenizer,
                text.text(),
                &out.tokens,
                &out.log_probs,
                Some(&out),
            ),
            Err(err) => err.stream_chunk(),
        };
        let _ = tx
            .send(Ok(SseEvent::default().data(last.to_string())))
            .await;
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Generates one token; 200 when the engine answers within 20 s, 503 otherwise.
pub async fn health_generate(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let sampling = SamplingParams {
        max_new_tokens: Some(1),
        temperature: Some(0.0),
        ignore_eos: Some(true),
        ..Default::default()
    }
    .validate()?;
    let rid = new_rid();
    let probe = run_request(
        &state,
        Request {
            input_ids: vec![0],
            sampling,
            session: None,
        },
        &rid,
        |_, _| true,
    );
    match tokio::time::timeout(std::time::Duration::from_secs(20), probe).await {
        Ok(Ok(out)) if out.tokens.len() == 1 => Ok(Json(json!({"status": "ok"}))),
        Ok(Ok(_)) => Err(ApiError {
            code: "unavailable",
            message: "the engine aborted the health probe".into(),
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ApiError {
            code: "unavailable",
            message: "the engine did not answer within 20 s".into(),
        }),
    }
}

pub async fn model_info(State(state): State<Arc<AppState>>) -> Json<Value> {
    let path = state.model_path.display().to_string();
    Json(
        json!({"model_path": path, "tokenizer_path": path, "is_generation": true, "served_model_name": state.model_name}),
    )
}

pub async fn server_info(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let stats = state.engine.stats().await?;
    let mut info = state.server_info.clone();
    // The KV memory's blocks at the top level too, where SGLang's clients look.
    info["kv_blocks_total"] = json!(stats.kv_blocks_total);
    info["kv_blocks_free"] = json!(stats.kv_blocks_free);
    info["kv_block_size"] = json!(stats.kv_block_size);
    // Deterministic numerics (`--deterministic`): log-probs equal a deterministic trainer's bitwise.
    info["deterministic"] = json!(ooze_torch::kernels::deterministic());
    info["engine"] = serde_json::to_value(stats).unwrap_or_default();
    info["ignored_fields"] = json!(state.ignored_fields.snapshot());
    Ok(Json(info))
}

pub async fn flush_cache(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    state.engine.flush_cache().await?;
    Ok(Json(json!({"success": true})))
}

#[derive(Deserialize)]
pub struct AbortRequest {
    rid: Option<String>,
    #[serde(default)]
    abort_all: bool,
}

pub async fn abort_request(
    State(state): State<Arc<AppState>>,
    LenientJson(req): LenientJson<AbortRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.abort_all {
        state.engine.abort_all();
        return Ok(Json(json!({"success": true})));
    }
    let rid = req
        .rid
        .ok_or_else(|| ApiError::invalid("`rid` or `abort_all: true` is required"))?;
    Ok(Json(json!({"success": state.abort_rid(&rid)})))
}

#[derive(Deserialize)]
pub struct PauseRequest {
    /// `abort` (SGLang's default), `retract` or `in_place`.
    #[serde(default = "default_pause_mode")]
    mode: PauseMode,
}

fn default_pause_mode() -> PauseMode {
    PauseMode::Abort
}

/// Stops generation until `/continue_generation`. The body (optional, as in SGLang) names what
/// happens to running requests: `abort` them with their partial output, `retract` them (preempted,
/// recomputed and continued on resume) or keep them `in_place`.
pub async fn pause(
    State(state): State<Arc<AppState>>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let mode = if body.iter().all(u8::is_ascii_whitespace) {
        default_pause_mode()
    } else {
        let (req, ignored) = crate::lenient_json::parse::<PauseRequest>(&body).map_err(|e| {
            ApiError::invalid(format!(
                "pause_generation body: {} (expected {{\"mode\": \"abort\" | \"retract\" | \"in_place\"}})",
                e.message
            ))
        })?;
        state.ignored_fields.count(&ignored);
        req.mode
    };
    state.engine.pause(mode);
    Ok(Json(json!({"success": true})))
}

pub async fn resume(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.engine.resume();
    Json(json!({"success": true}))
}

#[derive(Deserialize)]
pub struct UpdateWeightsRequest {
    model_path: String,
    /// Accepted for SGLang compatibility; ooze reads safetensors.
    #[allow(dead_code)]
    load_format: Option<String>,
}

pub async fn update_weights_from_disk(
    State(state): State<Arc<AppState>>,
    LenientJson(req): LenientJson<UpdateWeightsRequest>,
) -> Result<Json<Value>, ApiError> {
    let started = std::time::Instant::now();
    let version = state
        .engine
        .update_weights_from_disk(req.model_path.clone().into())
        .await?;
    eprintln!(
        "ooze serve: weights version {version}: loaded {} in {:.2}s",
        req.model_path,
        started.elapsed().as_secs_f64()
    );
    Ok(Json(
        json!({"success": true, "message": format!("loaded {}", req.model_path), "weight_version": version}),
    ))
}

/// Frees the KV memory for a trainer sharing the GPU; running requests are preempted and
/// recomputed when they run again (pause first to keep the memory free).
pub async fn release_memory(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let preempted = state.engine.release_memory().await?;
    Ok(Json(json!({"success": true, "preempted": preempted})))
}

/// The KV memory comes back with the next request; this only reports that it will.
pub async fn resume_memory() -> Json<Value> {
    Json(json!({"success": true, "message": "KV memory is allocated again by the next request"}))
}
