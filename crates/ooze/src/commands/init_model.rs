//! `ooze init-model`: a random-weight model in the Hugging Face format, with a tokenizer trained on
//! the given text (or on ooze's generated corpus).

use anyhow::Context;
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::Family;
use ooze_torch::DtypeSpec;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// qwen2 (Qwen2/Qwen2.5), qwen3 or llama (Llama 3.x).
    #[arg(long, default_value = "qwen2", value_parser = |s: &str| s.parse::<Family>())]
    family: Family,
    /// tiny, small, medium, or a real shape: 0.5b (Qwen2.5-0.5B), 4b (Qwen3-4B with --family qwen3),
    /// 7b (Qwen2.5-7B).
    #[arg(long, default_value = "tiny", value_parser = |s: &str| s.parse::<Size>())]
    size: Size,
    /// Text to train the BPE tokenizer on (one document per line), or chat JSONL (a `.jsonl` file
    /// of `{"messages", "tools"?}`, as `ooze sft` reads), rendered with the chat template first.
    /// Default: ooze's generated corpus.
    #[arg(long)]
    tokenizer_corpus: Option<PathBuf>,
    /// Tokenizer vocabulary size, special tokens included.
    #[arg(long, default_value_t = 1024)]
    tokenizer_vocab: usize,
    /// Embedding rows (default: the tokenizer's size; 151936 for 0.5b).
    #[arg(long)]
    vocab_size: Option<i64>,
    /// Give the LM head its own weights instead of tying it to the embeddings (the 7b shape's
    /// head has its own whatever this says, as Qwen2.5-7B's).
    #[arg(long)]
    untied: bool,
    #[arg(long, default_value_t = 0)]
    seed: i64,
    /// fp32 or bf16 weights on disk.
    #[arg(long, default_value = "fp32")]
    dtype: DtypeSpec,
    /// Largest safetensors shard, in MiB.
    #[arg(long, default_value_t = 2048)]
    max_shard_mib: usize,
    /// Output directory.
    out: PathBuf,
}

/// The model the flags ask for: the size's shape (the 7b shape's head untied, as Qwen2.5-7B's),
/// with the flags' changes.
fn options(args: &Args) -> InitOptions {
    let mut options = InitOptions::new(args.family, args.size);
    options.tokenizer_vocab = args.tokenizer_vocab;
    if args.vocab_size.is_some() {
        options.vocab_size = args.vocab_size;
    }
    if args.untied {
        options.tie_word_embeddings = false;
    }
    options.seed = args.seed;
    options.dtype = args.dtype.kind();
    options.max_shard_bytes = args.max_shard_mib << 20;
    options
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let corpus = match &args.tokenizer_corpus {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the tokenizer corpus {}", path.display()))?;
            if path.extension().is_some_and(|e| e == "jsonl") {
                ooze_model::init::render_chat_corpus(
                    args.family,
                    &text,
                    &path.display().to_string(),
                )?
            } else {
                text
            }
        }
        None => ooze_model::corpus::generate(args.seed as u64, 400_000),
    };
    if corpus.trim().is_empty() {
        anyhow::bail!("the tokenizer corpus is empty");
    }
    let options = options(&args);
    let started = std::time::Instant::now();
    let config = init_model(&args.out, &corpus, &options)?;
    eprintln!(
        "wrote {} ({} {:?}, {:.1}M parameters, vocab {}) in {:.1}s",
        args.out.display(),
        config.family.model_type(),
        args.size,
        config.num_parameters() as f64 / 1e6,
        config.vocab_size,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{options, Args};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn tied(flags: &[&str]) -> bool {
        let cli = Cli::parse_from(["init-model"].iter().chain(flags).chain(&["out"]));
        options(&cli.args).tie_word_embeddings
    }

    #[test]
    fn the_head_is_tied_as_the_shape_has_it_unless_untied_is_asked() {
        assert!(tied(&["--size", "tiny"]));
        assert!(tied(&["--size", "0.5b"]));
        assert!(!tied(&["--size", "7b"]), "Qwen2.5-7B's head is its own");
        assert!(!tied(&["--size", "tiny", "--untied"]));
        assert!(!tied(&["--size", "7b", "--untied"]));
    }
}
