//! `ooze score`: per-token log-probs of given sequences.
//!
//! Input: JSONL, one object per line with `tokens` (ids) or `text` (encoded with the model's
//! tokenizer, special tokens added as the tokenizer's post-processor says); other fields are echoed.
//! Output: JSONL with `tokens` and `log_probs`, where `log_probs[i]` is the log-prob of
//! `tokens[i + 1]` (so one fewer entry than tokens), plus `entropy` with `--entropy`.

use super::{load_decoder, load_tokenizer, ComputeArgs};
use anyhow::{bail, Context};
use ooze_model::{score_sequences, Layout, ScoreOptions};
use std::io::{BufRead, Write};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model directory (Hugging Face format).
    #[arg(long)]
    model: PathBuf,
    /// JSONL input ("-" for standard input).
    #[arg(long)]
    input: PathBuf,
    /// JSONL output (default: standard output).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Temperature the log-probs are taken at.
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Also report per-token entropy.
    #[arg(long)]
    entropy: bool,
    /// Sequences per forward pass.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// padded (right-padded batch) or packed (one row, block-diagonal mask).
    #[arg(long, default_value = "padded", value_parser = parse_layout)]
    layout: Layout,
    #[command(flatten)]
    compute: ComputeArgs,
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    match s {
        "padded" => Ok(Layout::Padded),
        "packed" => Ok(Layout::Packed),
        _ => Err(format!("unknown layout `{s}`; expected padded or packed")),
    }
}

struct Item {
    record: serde_json::Map<String, serde_json::Value>,
    tokens: Vec<u32>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(&args.input)
                .with_context(|| format!("opening {}", args.input.display()))?,
        ))
    };
    let name = args.input.display().to_string();
    let mut items = Vec::new();
    let mut tokenizer = None;
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("reading {name}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{name}:{}", n + 1);
        let record: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&line).with_context(|| format!("{at}: expected a JSON object"))?;
        let tokens = match (record.get("tokens"), record.get("text")) {
            (Some(tokens), _) => {
                serde_json::from_value::<Vec<u32>>(tokens.clone()).with_context(|| {
                    format!("{at}: `tokens` must be a list of non-negative token ids")
                })?
            }
            (None, Some(serde_json::Value::String(text))) => {
                if tokenizer.is_none() {
                    tokenizer = Some(load_tokenizer(&args.model)?);
                }
                tokenizer
                    .as_ref()
                    .expect("invariant: loaded above")
                    .encode(text, true)?
            }
            (None, Some(_)) => bail!("{at}: `text` must be a string"),
            (None, None) => bail!("{at}: expected a `tokens` list or a `text` string"),
        };
        if tokens.len() < 2 {
            bail!(
                "{at}: a sequence needs at least 2 tokens to score, got {}",
                tokens.len()
            );
        }
        items.push(Item { record, tokens });
    }
    let decoder = load_decoder(&args.model, &args.compute)?;
    let options = ScoreOptions {
        temperature: args.temperature,
        entropy: args.entropy,
        ..Default::default()
    };
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let started = std::time::Instant::now();
    let total: usize = items.iter().map(|i| i.tokens.len()).sum();
    for (b, batch) in items.chunks(args.batch_size).enumerate() {
        let seqs: Vec<Vec<u32>> = batch.iter().map(|i| i.tokens.clone()).collect();
        let scores = score_sequences(&decoder, &seqs, args.layout, &options)
            .with_context(|| format!("scoring batch {b}"))?;
        for (item, score) in batch.iter().zip(scores) {
            let mut record = item.record.clone();
            record.insert("tokens".into(), item.tokens.clone().into());
            record.insert("log_probs".into(), score.log_probs.into());
            if let Some(entropy) = score.entropy {
                record.insert("entropy".into(), entropy.into());
            }
            serde_json::to_writer(&mut out, &record)?;
            out.write_all(b"\n")?;
        }
    }
    out.flush()?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "scored {} sequences ({total} tokens) in {secs:.2}s ({:.0} tokens/s)",
        items.len(),
        total as f64 / secs.max(1e-9)
    );
    Ok(())
}
