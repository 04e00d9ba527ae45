//! `ooze`: one binary for RL post-training of LLM agents. Commands: `info`, `init-model`, `score`,
//! `render`, `generate`, `serve`, `task`, `env`, `sft`, `train`, `report`, `bench`.

mod commands;
mod out_of_memory;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ooze",
    version,
    about = "RL post-training for LLM agents, on libtorch"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// PyTorch version, CUDA availability, GPU names and memory.
    Info(commands::info::Args),
    /// Create a random-weight model with a trained tokenizer, in the Hugging Face format.
    InitModel(commands::init_model::Args),
    /// Per-token log-probs (and entropies) of given token ids or texts, JSONL in and out.
    Score(commands::score::Args),
    /// Render a conversation with the model's chat template: text, token ids, assistant spans.
    Render(commands::render::Args),
    /// Generate text from a prompt (a simple loop; the rollout engine serves real workloads).
    Generate(commands::generate::Args),
    /// Serve the model over SGLang- and OpenAI-compatible HTTP APIs.
    Serve(commands::serve::Args),
    /// Write a built-in synthetic task as prompts or SFT demonstrations (JSONL).
    Task(commands::task::Args),
    /// Write a recipe's generated dataset in the public format it reads.
    RecipeData(commands::recipe_data::Args),
    /// Build environment images and run commands in episodes of them.
    Env(commands::env::Args),
    /// Serve a BM25 index of a JSONL corpus with Search-R1's `/retrieve` API.
    Retrieve(commands::retrieve::Args),
    /// Supervised fine-tuning on chat JSONL (assistant tokens only), with checkpoints and resume.
    Sft(commands::sft::Args),
    /// Run an RL recipe (TOML): rollouts, rewards, training, eval, logs, checkpoints.
    Train(commands::train::Args),
    /// Write a run's HTML report with plots.
    Report(commands::report::Args),
    /// Throughput benchmarks.
    Bench(commands::bench::Args),
}

fn main() {
    out_of_memory::install();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(args) => commands::info::run(args),
        Command::InitModel(args) => commands::init_model::run(args),
        Command::Score(args) => commands::score::run(args),
        Command::Render(args) => commands::render::run(args),
        Command::Generate(args) => commands::generate::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Task(args) => commands::task::run(args),
        Command::RecipeData(args) => commands::recipe_data::run(args),
        Command::Env(args) => commands::env::run(args),
        Command::Retrieve(args) => commands::retrieve::run(args),
        Command::Sft(args) => commands::sft::run(args),
        Command::Train(args) => commands::train::run(args),
        Command::Report(args) => commands::report::run(args),
        Command::Bench(args) => commands::bench::run(args),
    };
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
