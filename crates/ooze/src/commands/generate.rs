//! `ooze generate`: text from a prompt with a plain decoding loop (one sequence, KV cache,
//! temperature / top-k / top-p sampling). The rollout engine is the fast path; this is for
//! trying a model out.

use super::{load_decoder, load_tokenizer, ComputeArgs};
use anyhow::bail;
use ooze_model::config::load_generation_eos;
use ooze_model::{KvCache, RenderOptions};
use ooze_torch::tch::{self, Kind, Tensor};
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
    seed: i64,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    compute: ComputeArgs,
}

/// Picks the next token from fp32 logits `[vocab]`.
fn sample(logits: &Tensor, args: &Args) -> i64 {
    if args.temperature <= 0.0 {
        return logits.argmax(-1, false).int64_value(&[]);
    }
    let mut logits = logits / args.temperature;
    if args.top_k > 0 && args.top_k < logits.size()[0] {
        let (top, _) = logits.topk(args.top_k, -1, true, true);
        let threshold = top.get(args.top_k - 1);
        logits = logits.masked_fill(&logits.lt_tensor(&threshold), f64::NEG_INFINITY);
    }
    if args.top_p < 1.0 {
        let (sorted, order) = logits.sort(-1, true);
        let cumulative = sorted.softmax(-1, Kind::Float).cumsum(-1, Kind::Float);
        // Drop a token when the tokens before it already reach top_p.
        let drop_sorted = (cumulative - sorted.softmax(-1, Kind::Float)).ge(args.top_p);
        let drop = drop_sorted.scatter(0, &order, &drop_sorted);
        logits = logits.masked_fill(&drop, f64::NEG_INFINITY);
    }
    logits
        .softmax(-1, Kind::Float)
        .multinomial(1, false)
        .int64_value(&[0])
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&args.top_p) || args.top_p == 0.0 {
        bail!("--top-p must be in (0, 1], got {}", args.top_p);
    }
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
    tch::manual_seed(args.seed);
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
    for _ in 0..args.max_new_tokens {
        let next = sample(&logits.get(0), &args) as u32;
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
        if generated.len() == args.max_new_tokens {
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
