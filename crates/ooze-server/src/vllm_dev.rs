//! vLLM's development endpoints that RL trainers call (`VLLM_SERVER_DEV_MODE=1` on a vLLM
//! server), so that a trainer driving vLLM servers drives `ooze serve` the same way:
//! `POST /collective_rpc` with `reload_weights` (new weights from a directory; no other method)
//! and `POST /reset_prefix_cache`.

use crate::error::ApiError;
use crate::lenient_json::LenientJson;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

#[derive(Deserialize)]
pub struct CollectiveRpc {
    method: String,
    #[serde(default)]
    kwargs: Map<String, Value>,
    /// Accepted for vLLM compatibility: positional arguments (`reload_weights` takes none here).
    #[serde(default)]
    args: Vec<Value>,
    /// Accepted for vLLM compatibility; the request's own deadline applies.
    #[allow(dead_code)]
    timeout: Option<f64>,
}

/// `reload_weights(weights_path=DIR)`: the weights of the HF directory `DIR`, as
/// `/update_weights_from_disk` loads them. The answer is vLLM's shape, one result per worker.
pub async fn collective_rpc(
    State(state): State<Arc<AppState>>,
    LenientJson(req): LenientJson<CollectiveRpc>,
) -> Result<Json<Value>, ApiError> {
    if req.method != "reload_weights" {
        return Err(ApiError::invalid(format!(
            "method: `{}`; ooze serve runs reload_weights only (with kwargs.weights_path)",
            req.method
        )));
    }
    if !req.args.is_empty() {
        return Err(ApiError::invalid(
            "args: reload_weights takes its directory as kwargs.weights_path",
        ));
    }
    let Some(path) = req.kwargs.get("weights_path").and_then(Value::as_str) else {
        return Err(ApiError::invalid(
            "kwargs.weights_path: expected the directory of the new weights (a string)",
        ));
    };
    let started = std::time::Instant::now();
    let version = state.engine.update_weights_from_disk(path.into()).await?;
    eprintln!(
        "ooze serve: weights version {version}: reloaded {path} in {:.2}s",
        started.elapsed().as_secs_f64()
    );
    Ok(Json(json!({"results": [null], "weight_version": version})))
}

pub async fn reset_prefix_cache(
    State(state): State<Arc<AppState>>,
) -> Result<Json<Value>, ApiError> {
    state.engine.flush_cache().await?;
    Ok(Json(json!({"success": true})))
}
