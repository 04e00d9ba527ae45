//! Fixtures of the engine's integration tests: a tiny random CPU model, an engine on it, a runtime.
#![allow(dead_code)]

use ooze_engine::{start, EngineConfig, EngineHandle};
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family, Tokenizer};
use ooze_torch::tch::{Device, Kind};
use std::path::Path;
use std::sync::Arc;

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
