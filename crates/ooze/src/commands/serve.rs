//! `ooze serve`: the embedded engine behind SGLang- and OpenAI-compatible HTTP APIs.

use super::{load_decoder, load_tokenizer, ComputeArgs};
use anyhow::Context;
use ooze_engine::EngineConfig;
use ooze_model::config::load_generation_eos;
use ooze_model::PagedKv;
use ooze_server::serve::{Phase, ServeConfig, Shutdown};
use ooze_server::AppState;
use ooze_torch::tch::Device;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model directory (Hugging Face format).
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 30000)]
    port: u16,
    /// Longest sequence (prompt + output) one request may have.
    #[arg(long, default_value_t = 4096)]
    context_len: i64,
    /// Sequences generated at once (default on a GPU: one per 1024 tokens of KV memory, at most
    /// 1024, or with fixed slots as many whole contexts as fit; 64 on CPU).
    #[arg(long)]
    max_running: Option<i64>,
    /// Share of the GPU memory free after loading the weights that the KV memory may take (on CPU
    /// the KV memory holds --max-running whole contexts).
    #[arg(long, default_value_t = 0.8)]
    mem_fraction: f64,
    /// Tokens per KV block (a multiple of 16). Sequences take blocks as they grow and share the
    /// blocks of common prefixes; a size of at least --context-len gives one fixed slot per
    /// sequence.
    #[arg(long, default_value_t = ooze_engine::handle::DEFAULT_KV_BLOCK_SIZE)]
    kv_block_size: i64,
    /// Name reported by /v1/models (default: the model directory's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Requests still running after this many seconds are aborted.
    #[arg(long, default_value_t = 600)]
    request_timeout_secs: u64,
    /// A connection that has not sent a complete request head within this many seconds (also the
    /// longest a kept-alive connection may sit idle) is closed.
    #[arg(long, default_value_t = 10)]
    header_timeout_secs: u64,
    /// A request body that has not fully arrived this many seconds after its head gets a 408.
    #[arg(long, default_value_t = 60)]
    body_timeout_secs: u64,
    /// Connections open at once; more are answered with a 503 and closed (lowered to fit the
    /// open-file limit).
    #[arg(long, default_value_t = 10_000)]
    max_connections: usize,
    /// On SIGTERM/SIGINT, new requests get 503 and running ones may finish for this many seconds;
    /// then they are aborted (streams end with finish reason "abort") and the server exits. A
    /// second signal aborts at once.
    #[arg(long, default_value_t = 20)]
    shutdown_drain_secs: u64,
    /// Serve as an agent gateway (OpenAI Chat Completions and Responses, Anthropic Messages):
    /// every call belongs to a session (opened with `POST /gateway/sessions`, named by the API key
    /// or `/s/{session}/`), and its samples are recorded token-exactly
    /// (`GET /gateway/sessions/{id}`).
    #[arg(long)]
    gateway: bool,
    /// With --gateway: write each session's calls to DIR/SESSION.jsonl.
    #[arg(long, requires = "gateway")]
    gateway_log_dir: Option<PathBuf>,
    /// With --gateway: the sampling temperature of every session's calls (what an agent sends is
    /// recorded, not applied).
    #[arg(long, default_value_t = 1.0, requires = "gateway")]
    gateway_temperature: f64,
    #[command(flatten)]
    compute: ComputeArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&args.mem_fraction) || args.mem_fraction == 0.0 {
        anyhow::bail!(
            "--mem-fraction must be in (0, 1], got {}",
            args.mem_fraction
        );
    }
    let tokenizer = Arc::new(load_tokenizer(&args.model)?);
    let decoder = load_decoder(&args.model, &args.compute)?;
    let eos =
        load_generation_eos(&args.model)?.unwrap_or_else(|| decoder.config.eos_token_ids.clone());
    let context_len = args.context_len.min(decoder.config.max_position_embeddings);
    let per_token = PagedKv::bytes_per_token(&decoder.config, decoder.kind());
    let fixed = args.kv_block_size >= context_len;
    let (max_running, kv_tokens) = match decoder.device() {
        Device::Cuda(i) => {
            let (free, _) =
                ooze_torch::cuda_driver::memory_info(i).context("querying free GPU memory")?;
            let tokens = (free as f64 * args.mem_fraction) as i64 / per_token;
            let per_sequence = if fixed { context_len } else { 1024 };
            let running = args
                .max_running
                .unwrap_or((tokens / per_sequence).clamp(1, 1024));
            (running, tokens)
        }
        _ => {
            let running = args.max_running.unwrap_or(64);
            (running, running * context_len)
        }
    };
    let config = EngineConfig::new(max_running, context_len, eos)
        .with_kv(Some(args.kv_block_size), Some(kv_tokens))
        .map_err(|e| {
            anyhow::anyhow!(
                "{e} (--context-len {context_len}, --mem-fraction {}, --kv-block-size {})",
                args.mem_fraction,
                args.kv_block_size
            )
        })?;
    eprintln!(
        "KV memory: {} blocks of {} tokens ({:.2} GiB), at most {max_running} sequences of {} tokens",
        config.kv_blocks(),
        config.kv_block_size,
        (config.kv_blocks() * config.kv_block_size * per_token) as f64 / (1u64 << 30) as f64,
        config.context_len
    );
    let server_info = serde_json::json!({"model_path": args.model, "context_len": context_len, "max_running_requests": max_running, "dtype": args.compute.dtype.to_string(), "device": format!("{:?}", decoder.device())});
    let weights_device = decoder.device();
    let engine = ooze_engine::start(decoder, Some(tokenizer.clone()), config);
    let name = args.served_model_name.clone().unwrap_or_else(|| {
        args.model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let gateway = if args.gateway {
        let mut gateway = ooze_server::gateway::Gateway::new(tokenizer.clone(), name.clone());
        let sampling = ooze_engine::SamplingParams {
            temperature: Some(args.gateway_temperature),
            ..Default::default()
        }
        .validate()
        .map_err(|e| anyhow::anyhow!("--gateway-temperature: {}", e.message))?;
        gateway.interactive = Some(ooze_server::gateway::Interactive {
            engine: engine.clone(),
            sampling,
            limits: ooze_rollout::agent::AgentLimits {
                max_context: context_len as usize,
                ..Default::default()
            },
            log_dir: args.gateway_log_dir.clone(),
        });
        Some(Arc::new(gateway))
    } else {
        None
    };
    let state = Arc::new(
        AppState::new(
            engine.clone(),
            tokenizer,
            name,
            args.model.clone(),
            Duration::from_secs(args.request_timeout_secs),
            server_info,
        )
        .with_weights_on(weights_device),
    );
    let config = ServeConfig {
        header_read_timeout: Duration::from_secs(args.header_timeout_secs),
        body_read_timeout: Duration::from_secs(args.body_timeout_secs),
        max_connections: connection_cap(args.max_connections)?,
        shutdown_drain: Duration::from_secs(args.shutdown_drain_secs),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = ooze_server::listen_on(&args.host, args.port).await?;
        eprintln!(
            "ooze serving {} on http://{} (at most {} connections{})",
            args.model.display(),
            listener.local_addr()?,
            config.max_connections,
            if gateway.is_some() {
                "; an agent gateway (OpenAI chat and responses, Anthropic messages): POST /gateway/sessions opens a session"
            } else {
                ""
            }
        );
        let shutdown = Shutdown::new();
        tokio::spawn(trigger_on_signals(shutdown.clone()));
        ooze_server::serve_app(listener, state, gateway, &config, &shutdown).await?;
        eprintln!("ooze serve: shutting down");
        engine.shutdown().await;
        anyhow::Ok(())
    })
}

/// File descriptors kept for everything but connections (model files, the engine, logs).
const RESERVED_FDS: u64 = 256;

/// Raises the open-file limit to its hard limit and fits `wanted` connections under it.
fn connection_cap(wanted: usize) -> anyhow::Result<usize> {
    if wanted == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    let limit = match ooze_server::fd_limit::raise_open_file_limit() {
        Ok(limit) => limit,
        Err(e) => {
            eprintln!("warning: could not raise the open-file limit: {e}");
            ooze_server::fd_limit::open_file_limit().context("reading the open-file limit")?
        }
    };
    eprintln!("open-file limit: {limit}");
    let fits = usize::try_from(limit.saturating_sub(RESERVED_FDS).max(1)).unwrap_or(usize::MAX);
    if wanted > fits {
        eprintln!(
            "warning: --max-connections {wanted} does not fit the open-file limit {limit}; serving at most {fits}"
        );
    }
    Ok(wanted.min(fits))
}

/// The first SIGTERM or SIGINT drains; another one aborts what is still running.
async fn trigger_on_signals(shutdown: Shutdown) {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("warning: no graceful shutdown on signals: {e}");
            return;
        }
    };
    loop {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        match shutdown.trigger() {
            Phase::Draining => {
                eprintln!("ooze serve: {name}: draining (again to abort running requests)")
            }
            _ => eprintln!("ooze serve: {name}: aborting running requests"),
        }
    }
}
