//! `ooze generate`: text from a prompt with a plain decoding loop (one sequence, KV cache,
//! temperature / top-k / top-p sampling). The rollout engine is the fast path; this is for
//! trying a model out. The settings go through the engine's validation
//! ([`ooze_engine::SamplingParams::validate`]: a NaN or negative temperature is an error naming
//! the flag, a tiny one is raised to the engine's floor) and tokens are drawn by the engine's
//! sampler, seeded the same way.

use super::{load_decoder, load_tokenizer, ComputeArgs};
use anyhow::{anyhow, bail};
use ooze_engine::sampler::{draw, RowSampling};
use ooze_engine::{Sampling, SamplingParams};
use ooze_model::config::load_generation_eos;
use ooze_model::{KvCache, RenderOptions};
use ooze_torch::tch::{self, Tensor};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model directory (Hugging Face format).
    #[arg(long)]
    model: PathBuf,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Keep the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: i64,
    /// Keep the smallest set of tokens whose probability reaches p (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    compute: ComputeArgs,
}

/// The flags as the engine's validated sampling settings; errors name the flag.
fn sampling(args: &Args) -> anyhow::Result<Sampling> {
    SamplingParams {
        temperature: Some(args.temperature),
        top_k: Some(args.top_k),
        top_p: Some(args.top_p),
        seed: Some(args.seed),
        max_new_tokens: Some(args.max_new_tokens),
        ignore_eos: Some(args.ignore_eos),
        ..Default::default()
    }
    .validate()
    .map_err(|e| anyhow!("--{} {}", e.field.replace('_', "-"), e.message))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let sampling = sampling(&args)?;
    let tokenizer = load_tokenizer(&args.model)?;
    let prompt = if args.chat {
        let messages = [serde_json::json!({"role": "user", "content": args.prompt})];
        let text = tokenizer.chat_template(false)?.render(
            &messages,
            &RenderOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )?;
        tokenizer.encode(&text, false)?
    } else {
        tokenizer.encode(&args.prompt, true)?
    };
    if prompt.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    let decoder = load_decoder(&args.model, &args.compute)?;
    let eos: Vec<u32> =
        load_generation_eos(&args.model)?.unwrap_or_else(|| decoder.config.eos_token_ids.clone());
    let device = decoder.device();
    let _guard = tch::no_grad_guard();
    let mut cache = KvCache::new(decoder.config.num_layers as usize);
    let started = std::time::Instant::now();
    let ids: Vec<i64> = prompt.iter().map(|&t| t as i64).collect();
    let mut logits = decoder.decode_step(
        &Tensor::from_slice(&ids).unsqueeze(0).to_device(device),
        &mut cache,
    );
    let first_token = started.elapsed();
    let mut generated: Vec<u32> = Vec::new();
    let mut printed = 0;
    let stdout = std::io::stdout();
    for step in 0..sampling.max_new_tokens {
        let row = RowSampling {
            params: &sampling,
            seed: args.seed,
            step: step as u64,
            banned: &[],
        };
        let next = draw(&logits, &[row])[0].token;
        generated.push(next);
        if !args.ignore_eos && eos.contains(&next) {
            break;
        }
        let text = tokenizer.decode(&generated, false)?;
        // Print only whole characters: a multi-byte character may still be incomplete.
        if !text.ends_with('\u{fffd}') {
            let mut out = stdout.lock();
            write!(out, "{}", &text[printed..])?;
            out.flush()?;
            printed = text.len();
        }
        if generated.len() == sampling.max_new_tokens {
            break;
        }
        logits = decoder.decode_step(
            &Tensor::from_slice(&[next as i64])
                .unsqueeze(0)
                .to_device(device),
            &mut cache,
        );
    }
    let text = tokenizer.decode(&generated, false)?;
    println!("{}", &text[printed.min(text.len())..]);
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{} prompt + {} generated tokens; first token {:.1} ms, {:.1} tokens/s",
        prompt.len(),
        generated.len(),
        first_token.as_secs_f64() * 1e3,
        generated.len() as f64 / secs.max(1e-9)
    );
    Ok(())
}
