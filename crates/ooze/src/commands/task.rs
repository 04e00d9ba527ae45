//! `ooze task TASK OUT.jsonl`: writes a built-in synthetic task as a dataset: prompt rows
//! (`{"prompt", "label"}`, for `[data] path`) or, with `--demonstrations`, chat rows with an
//! assistant answer for `ooze sft` (a share `--error-rate` of them deliberately wrong).

use ooze_core::SplitMix64;
use ooze_rollout::Task;
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// repeat, addition, arithmetic, countdown or string.
    #[arg(value_parser = parse_task)]
    task: Task,
    /// Output JSONL.
    out: PathBuf,
    /// Items to write.
    #[arg(long, default_value_t = 1000)]
    n: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Chat rows with a demonstration answer (for `ooze sft`) instead of prompt rows.
    #[arg(long)]
    demonstrations: bool,
    /// Share of demonstrations with a wrong final answer.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
}

fn parse_task(s: &str) -> Result<Task, String> {
    serde_json::from_value(json!(s)).map_err(|_| {
        format!("unknown task `{s}`; expected repeat, addition, arithmetic, countdown or string")
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&args.error_rate) {
        anyhow::bail!("--error-rate must be in [0, 1], got {}", args.error_rate);
    }
    let items = args.task.generate(args.n, args.seed);
    let mut rng = SplitMix64::new(args.seed ^ 0xde70);
    let mut rows = Vec::with_capacity(items.len());
    let mut wrong = 0;
    for item in &items {
        let row = if args.demonstrations {
            let answer = args.task.demonstration(item, &mut rng, args.error_rate);
            if args.task.verify(&answer, &item.label) == 0.0 {
                wrong += 1;
            }
            json!({"messages": [
                {"role": "user", "content": item.prompt},
                {"role": "assistant", "content": answer},
            ]})
        } else {
            json!({"prompt": item.prompt, "label": item.label})
        };
        rows.push(row);
    }
    super::write_jsonl(&args.out, &rows)?;
    eprintln!(
        "wrote {} {} rows to {}{}",
        items.len(),
        if args.demonstrations {
            "demonstration"
        } else {
            "prompt"
        },
        args.out.display(),
        if args.demonstrations {
            format!(" ({wrong} with a wrong answer)")
        } else {
            String::new()
        }
    );
    Ok(())
}
