//! ooze-router: the rollout backend over external engines. [`start`] gives an
//! [`EngineHandle`] like the embedded engine's; behind it, requests go to running servers that
//! speak SGLang's native API (`/generate`, `/update_weights_from_disk`, `/health`): SGLang itself
//! or `ooze serve`; or vLLM's ([`EngineApi::Vllm`], [`vllm`]: OpenAI completions with token ids,
//! weights reloaded from a directory).
//!
//! - Routing: a request with a session (an agent's conversation) goes to the engine its session
//!   hashes to among the healthy ones (rendezvous hashing: the session stays where its prefix is
//!   cached, and only the sessions of an engine that leaves move); one without goes to the engine
//!   with the fewest requests outstanding.
//! - Health: every engine's `/health` is asked on a schedule. One that does not answer is out of
//!   the rotation; its requests in flight fail (the connection drops or times out) and are sent
//!   again, whole, to another engine with the same seed, so a group is never lost. An engine that
//!   answers again first gets the current weights, then requests.
//! - Engines join mid-run: `engines_file` (one URL per line) is read again at every health check;
//!   a new engine gets the current weights before its first request.
//! - Weights: [`EngineHandle::update_weights_from_disk`] makes every healthy engine load the
//!   directory (`/update_weights_from_disk`), all at once, and returns the new version;
//!   [`EngineHandle::update_weights_from_tensors`] broadcasts the tensors to the engines over a
//!   process group instead (SGLang's `init_weights_update_group` and
//!   `update_weights_from_distributed`; `distributed`).

mod distributed;
mod vllm;
mod wire;

use ooze_engine::{
    Command, EngineHandle, EngineStats, Event, Output, PauseMode, Request, RequestId, WeightSource,
};
use ooze_rollout::http_client::{HttpError, JsonClient};
use serde_json::json;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc as async_mpsc;

/// Where the engines are and how the router treats them.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// Base URLs (`http://host:port`).
    pub engines: Vec<String>,
    /// A file of further engine URLs, one per line, read again at every health check.
    pub engines_file: Option<PathBuf>,
    /// Longest sequence (prompt + output) requests may ask for, and the vocabulary (requests are
    /// checked against both before they leave).
    pub slot_len: i64,
    pub vocab: i64,
    /// Time between health checks.
    pub health_interval: Duration,
    /// The longest a generation may take on one engine before it is tried on another.
    pub request_timeout: Duration,
    /// Engines a request is tried on before it ends as aborted.
    pub attempts: usize,
    /// The weight version the engines start at (a resumed run's).
    pub initial_weight_version: u64,
    /// For updates from tensors: the address engines reach this process at (the weight group's
    /// store), and the group's backend (NCCL between GPUs, Gloo between CPUs).
    pub trainer_address: String,
    pub weight_backend: ooze_torch::dist::Backend,
    /// The API the engines speak.
    pub api: EngineApi,
}

/// The API external engines speak (`rollout.engine_api`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineApi {
    /// SGLang's native API (SGLang, `ooze serve`).
    #[default]
    Sglang,
    /// vLLM's OpenAI-compatible server with its development endpoints (`VLLM_SERVER_DEV_MODE=1`).
    Vllm,
}

impl EngineApi {
    fn generate_path(self) -> &'static str {
        match self {
            EngineApi::Sglang => "/generate",
            EngineApi::Vllm => "/v1/completions",
        }
    }

    fn flush_path(self) -> &'static str {
        match self {
            EngineApi::Sglang => "/flush_cache",
            EngineApi::Vllm => "/reset_prefix_cache",
        }
    }
}

impl RouterConfig {
    pub fn new(engines: Vec<String>, slot_len: i64, vocab: i64) -> RouterConfig {
        RouterConfig {
            engines,
            engines_file: None,
            slot_len,
            vocab,
            health_interval: Duration::from_secs(2),
            request_timeout: Duration::from_secs(600),
            attempts: 4,
            initial_weight_version: 0,
            trainer_address: "127.0.0.1".into(),
            weight_backend: ooze_torch::dist::Backend::Nccl,
            api: EngineApi::Sglang,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("rollout.engines: `{0}` is not an http:// or https:// URL")]
    BadUrl(String),
    #[error("rollout.engines: no engine answers /health: {0}")]
    NoneAnswers(String),
    #[error("{path}: cannot read the engines file: {source}")]
    EnginesFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One external engine.
pub(crate) struct Engine {
    pub(crate) url: String,
    pub(crate) healthy: AtomicBool,
    outstanding: AtomicUsize,
    /// The weight version it holds (what it was last given).
    pub(crate) version: AtomicU64,
}

/// A request in flight: the engine it is on, and whether it was aborted.
type InFlight = HashMap<RequestId, (Arc<Engine>, Arc<AtomicBool>)>;

/// What the router's tasks share.
pub(crate) struct Shared {
    engines: Mutex<Vec<Arc<Engine>>>,
    config: RouterConfig,
    generate: JsonClient,
    control: JsonClient,
    /// The latest weights: their directory (none until the first update) and version.
    weights: Mutex<(Option<PathBuf>, u64)>,
    /// Requests in flight: the engine each is on and whether it was aborted.
    in_flight: Mutex<InFlight>,
    stopped: AtomicBool,
    /// Whether the engines have been given weights since they started (before, the model they
    /// were started with is the current one).
    updated: AtomicBool,
    /// The process group of distributed weight updates, and a counter naming each new one.
    weight_group: Mutex<Option<distributed::WeightGroup>>,
    group_serial: AtomicU64,
}

fn check_url(url: &str) -> Result<String, RouterError> {
    let url = url.trim().trim_end_matches('/');
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(url.to_owned())
    } else {
        Err(RouterError::BadUrl(url.to_owned()))
    }
}

fn new_engine(url: String, healthy: bool, version: u64) -> Arc<Engine> {
    Arc::new(Engine {
        url,
        healthy: AtomicBool::new(healthy),
        outstanding: AtomicUsize::new(0),
        version: AtomicU64::new(version),
    })
}

/// A 64-bit mix (SplitMix64's finaliser) for rendezvous hashing.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn url_hash(url: &str) -> u64 {
    url.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl Shared {
    fn new(config: RouterConfig, engines: Vec<Arc<Engine>>, control: JsonClient) -> Shared {
        Shared {
            engines: Mutex::new(engines),
            generate: JsonClient::new(config.request_timeout),
            control,
            weights: Mutex::new((None, config.initial_weight_version)),
            in_flight: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
            updated: AtomicBool::new(false),
            weight_group: Mutex::new(None),
            group_serial: AtomicU64::new(0),
            config,
        }
    }

    /// The engines in the rotation now.
    fn healthy(&self) -> Vec<Arc<Engine>> {
        self.engines
            .lock()
            .expect("engines lock")
            .iter()
            .filter(|e| e.healthy.load(Ordering::SeqCst))
            .cloned()
            .collect()
    }

    /// The engine for a request: the session's (rendezvous hashing over the healthy engines), or
    /// the least loaded; engines in `avoid` only when nothing else is healthy.
    fn pick(&self, session: Option<u64>, avoid: &[String]) -> Option<Arc<Engine>> {
        let engines = self.engines.lock().expect("engines lock");
        let healthy: Vec<&Arc<Engine>> = engines
            .iter()
            .filter(|e| e.healthy.load(Ordering::SeqCst))
            .collect();
        let fresh: Vec<&Arc<Engine>> = healthy
            .iter()
            .copied()
            .filter(|e| !avoid.contains(&e.url))
            .collect();
        let pool = if fresh.is_empty() { healthy } else { fresh };
        let chosen = match session {
            Some(s) => pool.into_iter().max_by_key(|e| mix(s ^ url_hash(&e.url))),
            None => pool
                .into_iter()
                .min_by_key(|e| e.outstanding.load(Ordering::SeqCst)),
        };
        chosen.cloned()
    }

    pub(crate) fn mark_down(&self, engine: &Engine, why: &str) {
        if engine.healthy.swap(false, Ordering::SeqCst) {
            eprintln!(
                "router: engine {} is out of the rotation ({why}); its requests go to the others",
                engine.url
            );
        }
    }

    /// Generates `request` on one engine after another until one answers.
    fn generate(
        &self,
        id: RequestId,
        request: &Request,
        prompt_log_probs_from: Option<usize>,
        aborted: &Arc<AtomicBool>,
    ) -> Output {
        let seed = request.sampling.seed.unwrap_or(0);
        let abort_output = || Output {
            id,
            tokens: Vec::new(),
            log_probs: Vec::new(),
            prompt_log_probs: Vec::new(),
            finish: ooze_core::FinishReason::Abort,
            prompt_tokens: request.input_ids.len(),
            cached_tokens: 0,
            weight_version: self.weights.lock().expect("weights lock").1,
            token_versions: Vec::new(),
            seed,
        };
        let rid = format!("ooze-router-{}", id.0);
        let api = self.config.api;
        let body = match api {
            EngineApi::Sglang => wire::generate_body(request, &rid, prompt_log_probs_from),
            EngineApi::Vllm => vllm::completion_body(request, prompt_log_probs_from),
        };
        let mut tried: Vec<String> = Vec::new();
        let mut waited = Duration::ZERO;
        while tried.len() < self.config.attempts {
            if aborted.load(Ordering::SeqCst) || self.stopped.load(Ordering::SeqCst) {
                return abort_output();
            }
            let Some(engine) = self.pick(request.session, &tried) else {
                // No engine is healthy now: wait for the health checks to bring one back.
                if waited >= self.config.request_timeout {
                    eprintln!(
                        "router: request {} gave up: no engine answered for {waited:?}",
                        id.0
                    );
                    return abort_output();
                }
                std::thread::sleep(Duration::from_millis(200));
                waited += Duration::from_millis(200);
                continue;
            };
            self.in_flight
                .lock()
                .expect("in-flight lock")
                .insert(id, (engine.clone(), aborted.clone()));
            engine.outstanding.fetch_add(1, Ordering::SeqCst);
            let version = engine.version.load(Ordering::SeqCst);
            let answer = self.generate.post(
                &format!("{}{}", engine.url, api.generate_path()),
                None,
                &body,
            );
            engine.outstanding.fetch_sub(1, Ordering::SeqCst);
            self.in_flight.lock().expect("in-flight lock").remove(&id);
            match answer {
                Ok(answer) => {
                    let parsed = match api {
                        EngineApi::Sglang => {
                            wire::parse_output(&answer, id, request.input_ids.len(), seed, version)
                        }
                        EngineApi::Vllm => vllm::parse_completion(
                            &answer,
                            id,
                            request,
                            prompt_log_probs_from,
                            seed,
                            version,
                        ),
                    };
                    match parsed {
                        Ok(output) => return output,
                        Err(e) => {
                            eprintln!("router: engine {}: {e}", engine.url);
                            self.mark_down(&engine, "its answer did not parse");
                        }
                    }
                }
                // A request the engine refuses is refused everywhere.
                Err(e) if matches!(e.status(), Some(400..=499)) => {
                    eprintln!("router: request {} refused: {e}", id.0);
                    return abort_output();
                }
                Err(e) => self.mark_down(&engine, &short(&e)),
            }
            tried.push(engine.url.clone());
        }
        eprintln!(
            "router: request {} failed on {} engines ({}); it ends as aborted",
            id.0,
            tried.len(),
            tried.join(", ")
        );
        abort_output()
    }

    /// Loads `dir` on `engine`; the engine is marked down when it cannot.
    fn push_weights(&self, engine: &Engine, dir: &std::path::Path, version: u64) -> bool {
        let loaded = match self.config.api {
            EngineApi::Sglang => self.generate.post(
                &format!("{}/update_weights_from_disk", engine.url),
                None,
                &json!({"model_path": dir.display().to_string()}),
            ),
            // Then nothing cached under the old weights is reused.
            EngineApi::Vllm => self
                .generate
                .post(
                    &format!("{}/collective_rpc", engine.url),
                    None,
                    &vllm::reload_body(dir),
                )
                .and_then(|_| {
                    self.control.post(
                        &format!("{}/reset_prefix_cache", engine.url),
                        None,
                        &json!({}),
                    )
                }),
        };
        match loaded {
            Ok(_) => {
                engine.version.store(version, Ordering::SeqCst);
                true
            }
            Err(e) => {
                self.mark_down(engine, &format!("loading new weights: {}", short(&e)));
                false
            }
        }
    }

    /// One round of health checks, and engines newly listed in the engines file.
    fn check_health(&self) {
        if let Some(path) = &self.config.engines_file {
            if let Ok(text) = std::fs::read_to_string(path) {
                let mut engines = self.engines.lock().expect("engines lock");
                for line in text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                {
                    match check_url(line) {
                        Ok(url) if !engines.iter().any(|e| e.url == url) => {
                            eprintln!(
                                "router: engine {url} listed in {}; it joins once it answers",
                                path.display()
                            );
                            engines.push(new_engine(url, false, u64::MAX));
                        }
                        Ok(_) => {}
                        Err(e) => eprintln!("router: {}: {e}", path.display()),
                    }
                }
            }
        }
        let engines: Vec<Arc<Engine>> = self.engines.lock().expect("engines lock").clone();
        for engine in engines {
            let answers = self
                .control
                .get(&format!("{}/health", engine.url), None)
                .is_ok()
                || self
                    .control
                    .get(&format!("{}/health_generate", engine.url), None)
                    .is_ok();
            let healthy = engine.healthy.load(Ordering::SeqCst);
            let (dir, version) = self.weights.lock().expect("weights lock").clone();
            if !answers {
                self.mark_down(&engine, "it does not answer /health");
            } else if healthy && engine.version.load(Ordering::SeqCst) != version {
                // It came back while new weights were being pushed: it gets them now.
                if let Some(dir) = &dir {
                    self.push_weights(&engine, dir, version);
                }
            } else if !healthy {
                let current = engine.version.load(Ordering::SeqCst) == version;
                let ready = match (&dir, current) {
                    (Some(dir), false) => self.push_weights(&engine, dir, version),
                    // Never updated: the model every engine started with is current.
                    (None, false) if !self.updated.load(Ordering::SeqCst) => {
                        engine.version.store(version, Ordering::SeqCst);
                        true
                    }
                    // Updated over a process group: it enters at the next update.
                    (None, false) => false,
                    _ => true,
                };
                if ready {
                    engine.healthy.store(true, Ordering::SeqCst);
                    eprintln!(
                        "router: engine {} is in the rotation (weights v{version})",
                        engine.url
                    );
                }
            }
        }
    }
}

/// An HTTP error in one line (the transport message, or the status).
pub(crate) fn short(e: &HttpError) -> String {
    let text = e.to_string();
    text.lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect()
}

/// Starts the router: checks that at least one engine answers, and returns the handle the
/// rollout uses. Health checks run every `health_interval` until the handle's engine is shut
/// down.
pub fn start(config: RouterConfig) -> Result<EngineHandle, RouterError> {
    let urls = config
        .engines
        .iter()
        .map(|u| check_url(u))
        .collect::<Result<Vec<_>, _>>()?;
    let control = JsonClient::new(Duration::from_secs(3));
    let version = config.initial_weight_version;
    let engines: Vec<Arc<Engine>> = urls
        .iter()
        .map(|u| {
            let up = control.get(&format!("{u}/health"), None).is_ok();
            new_engine(u.clone(), up, version)
        })
        .collect();
    if !engines.iter().any(|e| e.healthy.load(Ordering::SeqCst)) && config.engines_file.is_none() {
        return Err(RouterError::NoneAnswers(urls.join(", ")));
    }
    if let Some(path) = &config.engines_file {
        if !path.exists() && engines.is_empty() {
            return Err(RouterError::EnginesFile {
                path: path.clone(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
    }
    for e in &engines {
        if !e.healthy.load(Ordering::SeqCst) {
            eprintln!(
                "router: engine {} does not answer yet; it joins once it does",
                e.url
            );
        }
    }
    let shared = Arc::new(Shared::new(config, engines, control));
    let (tx, rx) = mpsc::channel::<Command>();
    let handle = EngineHandle::new(tx, shared.config.slot_len, shared.config.vocab);
    let health = shared.clone();
    std::thread::Builder::new()
        .name("ooze-router-health".into())
        .spawn(move || {
            while !health.stopped.load(Ordering::SeqCst) {
                health.check_health();
                std::thread::sleep(health.config.health_interval);
            }
        })
        .expect("invariant: a thread starts");
    std::thread::Builder::new()
        .name("ooze-router".into())
        .spawn(move || serve(shared, rx))
        .expect("invariant: a thread starts");
    Ok(handle)
}

/// The router's command loop: each request on its own blocking task.
fn serve(shared: Arc<Shared>, commands: mpsc::Receiver<Command>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1024)
        .enable_all()
        .build()
        .expect("invariant: a runtime starts");
    while let Ok(command) = commands.recv() {
        match command {
            Command::Submit {
                id,
                request,
                prompt_log_probs_from,
                events,
            } => {
                let shared = shared.clone();
                runtime.spawn_blocking(move || {
                    let aborted = Arc::new(AtomicBool::new(false));
                    let output = shared.generate(id, &request, prompt_log_probs_from, &aborted);
                    deliver(&events, output);
                });
            }
            Command::Abort(id) => abort(&shared, &runtime, Some(id)),
            Command::AbortAll => abort(&shared, &runtime, None),
            Command::Stats(reply) => {
                let engines = shared.engines.lock().expect("engines lock");
                let running = engines
                    .iter()
                    .map(|e| e.outstanding.load(Ordering::SeqCst))
                    .sum();
                // The engines' own KV memory is theirs to report (their /get_server_info).
                let _ = reply.send(EngineStats {
                    kv_blocks_total: 0,
                    kv_block_size: 0,
                    kv_blocks_free: 0,
                    kv_blocks_cached: 0,
                    max_running: 0,
                    running,
                    waiting: 0,
                    weight_version: shared.weights.lock().expect("weights lock").1,
                    paused: false,
                    kv_allocated: true,
                    preempted: 0,
                    overlapped_steps: 0,
                    decode_steps: 0,
                    decode_seconds: 0.0,
                    decode_rows: 0,
                    decode_positions: 0,
                });
            }
            Command::FlushCache(reply) => {
                broadcast(&shared, shared.config.api.flush_path(), json!({}));
                let _ = reply.send(());
            }
            // The engines' memory is their own GPUs'.
            Command::ReleaseMemory(reply) => {
                let _ = reply.send(0);
            }
            Command::Pause(mode) => {
                let mode = match mode {
                    PauseMode::Abort => "abort",
                    PauseMode::Retract => "retract",
                    PauseMode::InPlace => "in_place",
                };
                match shared.config.api {
                    EngineApi::Sglang => {
                        broadcast(&shared, "/pause_generation", json!({"mode": mode}))
                    }
                    EngineApi::Vllm => broadcast(&shared, "/pause", json!({})),
                }
            }
            Command::Continue => match shared.config.api {
                EngineApi::Sglang => broadcast(&shared, "/continue_generation", json!({})),
                EngineApi::Vllm => broadcast(&shared, "/resume", json!({})),
            },
            Command::UpdateWeights { source, reply } => {
                let shared = shared.clone();
                runtime.spawn_blocking(move || {
                    let _ = reply.send(update_weights(&shared, source));
                });
            }
            Command::Shutdown(reply) => {
                shared.stopped.store(true, Ordering::SeqCst);
                let _ = reply.send(());
                break;
            }
        }
    }
    shared.stopped.store(true, Ordering::SeqCst);
    runtime.shutdown_timeout(Duration::from_secs(1));
}

fn deliver(events: &async_mpsc::UnboundedSender<Event>, output: Output) {
    for (&token, &log_prob) in output.tokens.iter().zip(&output.log_probs) {
        let _ = events.send(Event::Token { token, log_prob });
    }
    let _ = events.send(Event::Done(output));
}

/// Aborts one request (or all): marked so that it is not tried again, and the engine it is on
/// told (`/abort_request`), which ends it with its partial output. vLLM has no abort by id: its
/// request runs to its end, and is not tried again.
fn abort(shared: &Arc<Shared>, runtime: &tokio::runtime::Runtime, id: Option<RequestId>) {
    let targets: Vec<(RequestId, Arc<Engine>)> = {
        let in_flight = shared.in_flight.lock().expect("in-flight lock");
        in_flight
            .iter()
            .filter(|(k, _)| id.is_none_or(|i| i == **k))
            .map(|(k, (engine, flag))| {
                flag.store(true, Ordering::SeqCst);
                (*k, engine.clone())
            })
            .collect()
    };
    if shared.config.api == EngineApi::Vllm {
        return;
    }
    for (rid, engine) in targets {
        let shared = shared.clone();
        runtime.spawn_blocking(move || {
            let url = format!("{}/abort_request", engine.url);
            let _ = shared.control.post(
                &url,
                None,
                &json!({"rid": format!("ooze-router-{}", rid.0)}),
            );
        });
    }
}

/// POSTs `body` to `path` on every healthy engine.
fn broadcast(shared: &Shared, path: &str, body: serde_json::Value) {
    for engine in shared.healthy() {
        if let Err(e) = shared
            .control
            .post(&format!("{}{path}", engine.url), None, &body)
        {
            eprintln!("router: engine {}: {}", engine.url, short(&e));
        }
    }
}

/// Every healthy engine loads the directory, in parallel; the new version once at least one has.
fn update_weights(shared: &Arc<Shared>, source: WeightSource) -> Result<u64, String> {
    let dir = match source {
        WeightSource::Dir(dir) => dir,
        WeightSource::Tensors(_) if shared.config.api == EngineApi::Vllm => {
            return Err("vLLM engines take new weights from a directory (rollout.weight_sync = \"disk\"): vLLM's NCCL weight transfer joins through its own Python process group".into())
        }
        WeightSource::Tensors(tensors) => {
            return distributed::update(shared, WeightSource::Tensors(tensors))
        }
        WeightSource::InPlace => {
            return Err(
                "external engines (rollout.engines) share no tensors with this process".into(),
            )
        }
    };
    let version = shared.weights.lock().expect("weights lock").1 + 1;
    let engines = shared.healthy();
    let loaded = std::thread::scope(|s| {
        let jobs: Vec<_> = engines
            .iter()
            .map(|e| s.spawn(|| shared.push_weights(e, &dir, version)))
            .collect();
        jobs.into_iter()
            .map(|j| j.join())
            .filter(|r| matches!(r, Ok(true)))
            .count()
    });
    // Recorded first: an engine that comes back later gets these weights before requests.
    *shared.weights.lock().expect("weights lock") = (Some(dir.clone()), version);
    shared.updated.store(true, Ordering::SeqCst);
    if loaded == 0 {
        return Err(format!(
            "no engine loaded {} (each is out of the rotation until it answers again)",
            dir.display()
        ));
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(urls: &[&str]) -> Shared {
        let config = RouterConfig::new(urls.iter().map(|u| u.to_string()).collect(), 64, 100);
        Shared::new(
            config,
            urls.iter()
                .map(|u| new_engine(u.to_string(), true, 0))
                .collect(),
            JsonClient::new(Duration::from_secs(1)),
        )
    }

    #[test]
    fn sessions_stay_on_their_engine_and_only_a_lost_engines_sessions_move() {
        let s = shared(&["http://a", "http://b", "http://c"]);
        let before: Vec<String> = (0..300)
            .map(|k| s.pick(Some(k), &[]).unwrap().url.clone())
            .collect();
        // Stable, and spread over every engine.
        for (k, url) in before.iter().enumerate() {
            assert_eq!(&s.pick(Some(k as u64), &[]).unwrap().url, url);
        }
        for e in ["http://a", "http://b", "http://c"] {
            let n = before.iter().filter(|u| *u == e).count();
            assert!((60..=140).contains(&n), "{e} has {n} of 300 sessions");
        }
        let b = s.engines.lock().unwrap()[1].clone();
        s.mark_down(&b, "test");
        for (k, url) in before.iter().enumerate() {
            let now = s.pick(Some(k as u64), &[]).unwrap().url.clone();
            if url != "http://b" {
                assert_eq!(&now, url, "session {k} moved although its engine stayed");
            } else {
                assert_ne!(now, "http://b");
            }
        }
    }

    #[test]
    fn a_request_without_a_session_goes_to_the_least_loaded_engine_not_yet_tried() {
        let s = shared(&["http://a", "http://b"]);
        s.engines.lock().unwrap()[0]
            .outstanding
            .store(3, Ordering::SeqCst);
        assert_eq!(s.pick(None, &[]).unwrap().url, "http://b");
        assert_eq!(s.pick(None, &["http://b".into()]).unwrap().url, "http://a");
        // Every healthy engine tried: the least loaded again rather than none.
        let all = ["http://a".to_string(), "http://b".to_string()];
        assert_eq!(s.pick(None, &all).unwrap().url, "http://b");
        for e in s.engines.lock().unwrap().iter() {
            e.healthy.store(false, Ordering::SeqCst);
        }
        assert!(s.pick(None, &[]).is_none());
    }
}
