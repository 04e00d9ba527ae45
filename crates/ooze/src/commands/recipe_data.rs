//! `ooze recipe-data RECIPE OUT_DIR`: writes a recipe's generated dataset in the public format the
//! recipe reads, so it can be tried with no downloads.
//!
//! - `search_r1`: `corpus.jsonl` (`{"id", "contents": "Title\ntext"}`), `train` and `test` (each
//!   as `.jsonl` and as `.parquet`, Search-R1's format) in Search-R1's row layout (`prompt` messages, `reward_model.ground_truth.target`
//!   gold answers). The facts are made up, so only searching finds the answers. With
//!   `--demonstrations`, `sft.jsonl` holds a worked trajectory per train question.
//! - `retool`: `train` and `test` (`.jsonl` and `.parquet`), multi-step arithmetic problems in the DAPO-Math /
//!   ReTool row layout (`prompt` messages, `reward_model.ground_truth`); with `--demonstrations`,
//!   `sft.jsonl` holds a worked solution with one `code_interpreter` call each.
//!   `--task addition` writes two-number sums instead (for all four arithmetic recipes).
//! - `multi_agent`, `agentflow`, `tool_orchestra`: the same arithmetic problems in the same layout,
//!   the bare problem in `extra_info.problem` (these agents write their own prompts around it);
//!   demonstrations: a solver's, a rewriter's and a selector's reply (multi_agent), a planner step
//!   (agentflow), a call to an expert's `answer`, each expert as often (tool_orchestra); tool_orchestra also
//!   writes `experts.jsonl`, an expert's reply to an `answer` and a `reason` request per problem,
//!   to warm-start expert models.
//! - `memagent`: long-document QA rows (`context` document, `question`, gold answers in
//!   `reward_model.ground_truth`): `train` at `--words` words per document and
//!   `test_<words>` sets at 1, 2, 4 and 8 times that, for evaluation at growing context lengths;
//!   demonstrations: each memory update and the boxed answer, reading ~200-word sections.

use super::write_jsonl;
use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// search_r1, retool, multi_agent, memagent, agentflow or tool_orchestra
    recipe: String,
    out: PathBuf,
    /// Questions (and facts) to write; a tenth more go to the test split.
    #[arg(long, default_value_t = 1000)]
    n: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write `sft.jsonl`: chat rows with a worked trajectory for each train question.
    #[arg(long)]
    demonstrations: bool,
    /// retool, multi_agent, agentflow, tool_orchestra: the problems, `arithmetic` (multi-step
    /// expressions) or `addition` (two numbers below 100).
    #[arg(long)]
    task: Option<String>,
    /// multi_agent: solutions the rewriter and selector demonstrations show (the recipe's
    /// `agent.solvers`).
    #[arg(long, default_value_t = 5)]
    solvers: usize,
    /// memagent: words per training document.
    #[arg(long, default_value_t = 600)]
    words: usize,
}

/// Writes question rows as `NAME.jsonl` and, in the public format, `NAME.parquet`.
fn write_split(
    dir: &std::path::Path,
    name: &str,
    rows: &[serde_json::Value],
) -> anyhow::Result<()> {
    write_jsonl(&dir.join(format!("{name}.jsonl")), rows)?;
    let parquet = dir.join(format!("{name}.parquet"));
    ooze_rollout::parquet_out::write_rows(&parquet, rows).map_err(anyhow::Error::msg)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.task.is_some()
        && !matches!(
            args.recipe.as_str(),
            "retool" | "multi_agent" | "agentflow" | "tool_orchestra"
        )
    {
        anyhow::bail!(
            "--task applies to retool, multi_agent, agentflow and tool_orchestra, not {}",
            args.recipe
        );
    }
    match args.recipe.as_str() {
        "search_r1" => {
            let test_n = (args.n / 10).max(1);
            let data = ooze_agents::recipes::search_r1::synthetic(args.n + test_n, args.seed);
            std::fs::create_dir_all(&args.out)
                .with_context(|| format!("creating {}", args.out.display()))?;
            let (train, test) = data.questions.split_at(args.n);
            let mut test = test.to_vec();
            for row in &mut test {
                row["extra_info"]["split"] = "test".into();
            }
            write_jsonl(&args.out.join("corpus.jsonl"), &data.corpus)?;
            write_split(&args.out, "train", train)?;
            write_split(&args.out, "test", &test)?;
            if args.demonstrations {
                let rows: Vec<serde_json::Value> = train
                    .iter()
                    .zip(&data.corpus)
                    .map(|(row, fact)| {
                        serde_json::json!({"messages": [
                            row["prompt"][0],
                            {"role": "assistant", "content": ooze_agents::recipes::search_r1::demonstration(row, fact)},
                        ]})
                    })
                    .collect();
                write_jsonl(&args.out.join("sft.jsonl"), &rows)?;
            }
            eprintln!(
                "wrote {} documents, {} train and {} test questions to {}",
                data.corpus.len(),
                train.len(),
                test.len(),
                args.out.display()
            );
            Ok(())
        }
        "retool" | "multi_agent" | "agentflow" | "tool_orchestra" => math_recipe(&args),
        "memagent" => memagent(&args),
        other => anyhow::bail!("unknown recipe `{other}`; expected search_r1, retool, multi_agent, memagent, agentflow or tool_orchestra"),
    }
}

/// The arithmetic recipes (DAPO-Math rows).
fn math_recipe(args: &Args) -> anyhow::Result<()> {
    use ooze_agents::recipes::{agentflow, multi_agent, retool, tool_orchestra};
    let test_n = (args.n / 10).max(1);
    let total = args.n + test_n;
    let name = args.task.as_deref().unwrap_or("arithmetic");
    let task = ooze_agents::recipes::MATH_TASKS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, task)| *task)
        .with_context(|| format!("--task {name}: expected arithmetic or addition"))?;
    let mut rows = match args.recipe.as_str() {
        "retool" => retool::synthetic(total, args.seed, task),
        "multi_agent" => multi_agent::synthetic(total, args.seed, task),
        "agentflow" => agentflow::synthetic(total, args.seed, task),
        _ => tool_orchestra::synthetic(total, args.seed, task),
    };
    let test = rows.split_off(args.n);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    write_split(&args.out, "train", &rows)?;
    write_split(&args.out, "test", &test)?;
    if args.demonstrations {
        let demos: Vec<serde_json::Value> = match args.recipe.as_str() {
            "retool" => rows
                .iter()
                .map(|row| {
                    serde_json::json!({"messages": [
                        row["prompt"][0],
                        {"role": "assistant", "content": retool::demonstration(row)},
                    ]})
                })
                .collect(),
            "multi_agent" => rows
                .iter()
                .flat_map(|row| multi_agent::demonstrations(row, args.solvers))
                .collect(),
            "agentflow" => rows.iter().map(agentflow::demonstration).collect(),
            _ => rows.iter().map(tool_orchestra::demonstration).collect(),
        };
        write_jsonl(&args.out.join("sft.jsonl"), &demos)?;
        if args.recipe == "tool_orchestra" {
            let experts: Vec<serde_json::Value> = rows
                .iter()
                .flat_map(tool_orchestra::expert_demonstrations)
                .collect();
            write_jsonl(&args.out.join("experts.jsonl"), &experts)?;
        }
    }
    eprintln!(
        "wrote {} train and {} test problems to {}",
        rows.len(),
        test.len(),
        args.out.display()
    );
    Ok(())
}

/// MemAgent's long documents: train, and test sets at growing lengths.
fn memagent(args: &Args) -> anyhow::Result<()> {
    use ooze_agents::recipes::memagent;
    anyhow::ensure!(args.words >= 50, "--words must be at least 50");
    let train = memagent::synthetic(args.n, args.words, args.seed);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    write_split(&args.out, "train", &train)?;
    let test_n = (args.n / 10).max(1);
    for (k, factor) in [1usize, 2, 4, 8].into_iter().enumerate() {
        let words = args.words * factor;
        let rows = memagent::synthetic(test_n, words, args.seed ^ (0x7e57 + k as u64));
        write_split(&args.out, &format!("test_{words}"), &rows)?;
    }
    if args.demonstrations {
        let mut demos = Vec::new();
        for row in &train {
            let doc = row["context"].as_str().unwrap_or_default();
            demos.extend(memagent::demonstrations(row, &sections(doc, 200)));
        }
        write_jsonl(&args.out.join("sft.jsonl"), &demos)?;
    }
    eprintln!(
        "wrote {} train documents of {} words and test sets of {test_n} at {}, {}, {} and {} words to {}",
        train.len(),
        args.words,
        args.words,
        2 * args.words,
        4 * args.words,
        8 * args.words,
        args.out.display()
    );
    Ok(())
}

/// `text` cut after the sentence that reaches each `words` words.
fn sections(text: &str, words: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut count) = (0, 0);
    for (i, c) in text.char_indices() {
        if c == ' ' {
            count += 1;
            if count >= words && text[..i].ends_with('.') {
                out.push(&text[start..i + 1]);
                start = i + 1;
                count = 0;
            }
        }
    }
    out.push(&text[start..]);
    out
}
