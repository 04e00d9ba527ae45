//! Fixtures of the engine's integration tests: a tiny random CPU model, an engine on it, a runtime.
#![allow(dead_code)]

use ooze_engine::{start, EngineConfig, EngineHandle, Event, Output, PauseMode, Request};
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family, Tokenizer};
use ooze_torch::tch::{Device, Kind};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// A tiny random Qwen2-family model (vocabulary 400); its weights depend only on `seed`.
pub fn tiny_model(seed: i64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut options = InitOptions::new(Family::Qwen2, Size::Tiny);
    options.tokenizer_vocab = 400;
    options.seed = seed;
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(3, 30_000),
        &options,
    )
    .unwrap();
    dir
}

/// An engine on the model in `dir`, fp32 on the CPU, with its tokenizer (for stop strings).
pub fn start_engine(dir: &Path, config: EngineConfig) -> EngineHandle {
    let decoder = Decoder::load(dir, Device::Cpu, Kind::Float).unwrap();
    start(
        decoder,
        Some(Arc::new(Tokenizer::load(dir).unwrap())),
        config,
    )
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// Runs every request to the end. The engine is paused while they are submitted, so it admits
/// them all at once: which requests share a pass must not depend on how fast this thread submits
/// (a CPU matmul of another row count may round differently).
pub async fn all(handle: &EngineHandle, requests: Vec<Request>) -> Vec<Output> {
    handle.pause(PauseMode::InPlace);
    let streams: Vec<_> = requests
        .into_iter()
        .map(|r| handle.submit(r).unwrap().1)
        .collect();
    handle.resume();
    let mut outs = Vec::new();
    for rx in streams {
        outs.push(streamed(rx).await);
    }
    outs
}

/// A request's output, checked against the tokens streamed before it.
pub async fn streamed(mut rx: UnboundedReceiver<Event>) -> Output {
    let mut tokens = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Token { token, .. } => tokens.push(token),
            Event::Done(out) => {
                assert_eq!(out.tokens, tokens, "streamed tokens are the output's");
                return out;
            }
        }
    }
    panic!("the stream ended without an output")
}

/// The output at the end of a stream whose events may already have been read in part.
pub async fn done(mut rx: UnboundedReceiver<Event>) -> Output {
    while let Some(event) = rx.recv().await {
        if let Event::Done(out) = event {
            return out;
        }
    }
    panic!("the stream ended without an output")
}
