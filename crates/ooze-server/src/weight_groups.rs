//! SGLang's weight update over a process group, as trainers drive it: the trainer (rank 0) and the
//! engines form a group (`/init_weights_update_group`: its store at `master_address:master_port`,
//! this engine rank `rank_offset`, keys under `group_name/` as `torch.distributed` keeps them),
//! then for every update the trainer names the tensors (`/update_weights_from_distributed`:
//! names, dtypes, shapes) and broadcasts each from rank 0 in that order; the engine receives them
//! on its device and loads them between two steps. NCCL on GPUs, Gloo on CPUs.

use crate::error::ApiError;
use crate::lenient_json::LenientJson;
use crate::AppState;
use axum::extract::State;
use axum::Json;
use ooze_torch::dist::{Backend, ProcessGroup, Rendezvous};
use ooze_torch::tch::{Device, Kind, Tensor};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long joining a group, and each broadcast, may wait for the trainer.
const GROUP_TIMEOUT: Duration = Duration::from_secs(600);

/// The engine's weight update groups, by name, and the device weights arrive on.
pub struct WeightGroups {
    device: Device,
    groups: Mutex<HashMap<String, Arc<ProcessGroup>>>,
}

impl WeightGroups {
    pub fn new(device: Device) -> WeightGroups {
        WeightGroups {
            device,
            groups: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, name: &str) -> Result<Arc<ProcessGroup>, ApiError> {
        self.groups
            .lock()
            .expect("groups lock")
            .get(name)
            .cloned()
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "group_name: no weight update group `{name}` (call /init_weights_update_group first)"
                ))
            })
    }
}

fn internal(message: String) -> ApiError {
    ApiError {
        code: "weight_update_failed",
        message,
    }
}

#[derive(Deserialize)]
pub struct InitGroup {
    master_address: String,
    master_port: u16,
    rank_offset: usize,
    world_size: usize,
    group_name: String,
    #[serde(default = "default_backend")]
    backend: String,
}

fn default_backend() -> String {
    "nccl".into()
}

pub async fn init_weights_update_group(
    State(state): State<Arc<AppState>>,
    LenientJson(req): LenientJson<InitGroup>,
) -> Result<Json<Value>, ApiError> {
    let backend = match req.backend.as_str() {
        "nccl" => Backend::Nccl,
        "gloo" => Backend::Gloo,
        other => {
            return Err(ApiError::invalid(format!(
                "backend: `{other}`; expected nccl or gloo"
            )))
        }
    };
    if req.rank_offset == 0 || req.rank_offset >= req.world_size {
        return Err(ApiError::invalid(format!(
            "rank_offset {} must be in [1, world_size {}) (rank 0 is the trainer)",
            req.rank_offset, req.world_size
        )));
    }
    let rendezvous = Rendezvous {
        rank: req.rank_offset,
        world_size: req.world_size,
        local_rank: 0,
        master_addr: req.master_address.clone(),
        master_port: req.master_port,
        agent_store: false,
    };
    let prefix = format!("{}/", req.group_name);
    let group = tokio::task::spawn_blocking(move || {
        ProcessGroup::connect_with_prefix(&rendezvous, backend, GROUP_TIMEOUT, &prefix)
    })
    .await
    .map_err(|e| internal(e.to_string()))?
    .map_err(|e| {
        internal(format!(
            "joining weight update group `{}`: {e}",
            req.group_name
        ))
    })?;
    state
        .weight_groups
        .groups
        .lock()
        .expect("groups lock")
        .insert(req.group_name.clone(), Arc::new(group));
    Ok(Json(json!({
        "success": true,
        "message": format!("joined `{}` as rank {} of {}", req.group_name, req.rank_offset, req.world_size),
    })))
}

#[derive(Deserialize)]
pub struct UpdateFromDistributed {
    names: Vec<String>,
    dtypes: Vec<String>,
    shapes: Vec<Vec<i64>>,
    group_name: String,
}

fn kind_of(dtype: &str) -> Option<Kind> {
    match dtype.strip_prefix("torch.").unwrap_or(dtype) {
        "bfloat16" => Some(Kind::BFloat16),
        "float16" | "half" => Some(Kind::Half),
        "float32" | "float" => Some(Kind::Float),
        "float64" | "double" => Some(Kind::Double),
        _ => None,
    }
}

pub async fn update_weights_from_distributed(
    State(state): State<Arc<AppState>>,
    LenientJson(req): LenientJson<UpdateFromDistributed>,
) -> Result<Json<Value>, ApiError> {
    let started = std::time::Instant::now();
    let n = req.names.len();
    if req.dtypes.len() != n || req.shapes.len() != n {
        return Err(ApiError::invalid(format!(
            "names ({n}), dtypes ({}) and shapes ({}) must be as long as each other",
            req.dtypes.len(),
            req.shapes.len()
        )));
    }
    let kinds = req
        .dtypes
        .iter()
        .enumerate()
        .map(|(i, d)| {
            kind_of(d).ok_or_else(|| {
                ApiError::invalid(format!(
                    "dtypes[{i}]: `{d}`; expected bfloat16, float16, float32 or float64"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some((i, s)) = req
        .shapes
        .iter()
        .enumerate()
        .find(|(_, s)| s.iter().any(|&d| d < 0))
    {
        return Err(ApiError::invalid(format!(
            "shapes[{i}]: {s:?} has a negative size"
        )));
    }
    let group = state.weight_groups.get(&req.group_name)?;
    let device = state.weight_groups.device;
    let (names, shapes) = (req.names, req.shapes);
    let received = tokio::task::spawn_blocking(move || {
        let mut out = Vec::with_capacity(names.len());
        for ((name, shape), kind) in names.into_iter().zip(shapes).zip(kinds) {
            let mut t = Tensor::empty(shape.as_slice(), (kind, device));
            group
                .broadcast(&mut t, 0)
                .map_err(|e| format!("receiving {name}: {e}"))?;
            out.push((name, t));
        }
        Ok::<_, String>(out)
    })
    .await
    .map_err(|e| internal(e.to_string()))?;
    let tensors = match received {
        Ok(t) => t,
        Err(e) => {
            // A broken group stays broken: the trainer forms a new one.
            state
                .weight_groups
                .groups
                .lock()
                .expect("groups lock")
                .remove(&req.group_name);
            return Err(internal(e));
        }
    };
    let count = tensors.len();
    let version = state.engine.update_weights_from_tensors(tensors).await?;
    eprintln!(
        "ooze serve: weights version {version}: {count} tensors from group {} in {:.2}s",
        req.group_name,
        started.elapsed().as_secs_f64()
    );
    Ok(Json(
        json!({"success": true, "message": "weights updated", "weight_version": version}),
    ))
}

#[derive(Deserialize)]
pub struct DestroyGroup {
    group_name: String,
}

pub async fn destroy_weights_update_group(
    State(state): State<Arc<AppState>>,
    LenientJson(req): LenientJson<DestroyGroup>,
) -> Json<Value> {
    let removed = state
        .weight_groups
        .groups
        .lock()
        .expect("groups lock")
        .remove(&req.group_name)
        .is_some();
    Json(json!({"success": removed}))
}
