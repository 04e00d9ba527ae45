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
//!   demonstrations: a solver's, a rewriter's and a selector's reply (multi_agent), a call to an
//!   expert's `answer`, each expert as often (tool_orchestra); tool_orchestra also
//!   writes `experts.jsonl`, an expert's reply to an `answer` and a `reason` request per problem,
//!   to warm-start expert models.
//! - `memagent`: long-document QA rows (`context` document, `question`, gold answers in
//!   `reward_model.ground_truth`): `train` at `--words` words per document and
//!   `test_<words>` sets at 1, 2, 4 and 8 times that, for evaluation at growing context lengths;
//!   demonstrations: each memory update and the boxed answer, reading ~200-word sections.
//!
//! agentflow's demonstrations are recorded from the agent itself ([`ooze_run::demonstrate`]):
//! every training problem runs through the recipe's agent (`--recipe`, with `--set`; default: the
//! agent type's defaults) with an oracle writing the planner's steps and playing the executor,
//! verifier, generator and judge, rendered with `--model`'s chat template (default: the recipe's
//! `model.path`). They cover every turn the agent renders, the modules' included, with the real
//! tool outputs.

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
    /// agentflow demonstrations: the recipe whose agent is run (default: the agent type's
    /// defaults).
    #[arg(long = "recipe")]
    recipe_file: Option<PathBuf>,
    /// agentflow demonstrations: the model whose tokenizer and chat template render the turns
    /// (default: the recipe's `model.path`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// agentflow demonstrations: KEY=VALUE overrides of the recipe, as in `ooze train`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
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
    if !args.sets.is_empty() || args.recipe_file.is_some() || args.model.is_some() {
        anyhow::ensure!(
            args.demonstrations && args.records_demonstrations(),
            "--recipe, --model and --set apply to agentflow's --demonstrations"
        );
    }
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
            "agentflow" => recorded(args)?,
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

impl Args {
    /// Whether this recipe's demonstrations are recorded from its agent.
    fn records_demonstrations(&self) -> bool {
        self.recipe == "agentflow"
    }
}

/// The demonstrations recorded from the recipe's agent on the train split just written.
fn recorded(args: &Args) -> anyhow::Result<Vec<serde_json::Value>> {
    let train = args.out.join("train.jsonl").display().to_string();
    let mut sets = vec![format!("data.path={}", toml_string(&train))];
    if let Some(model) = &args.model {
        sets.push(format!(
            "model.path={}",
            toml_string(&model.display().to_string())
        ));
    }
    sets.extend(args.sets.iter().cloned());
    let recipe = match &args.recipe_file {
        Some(path) => ooze_run::recipe::Recipe::load(path, &sets)?,
        None => {
            let defaults = format!(
                "[model]\npath = \"(set --model)\"\n[data]\ninput_key = \"prompt\"\n\
                 label_key = \"reward_model.ground_truth\"\nmetadata_key = \"extra_info\"\n\
                 [agent]\ntype = \"{}\"\n{}",
                args.recipe,
                ["executor", "verifier", "generator", "judge"]
                    .map(|h| format!("[helpers.{h}]\npolicy = true\n"))
                    .concat()
            );
            ooze_run::recipe::Recipe::parse(
                &defaults,
                std::path::Path::new("(agent defaults)"),
                &sets,
            )?
        }
    };
    let model = &recipe.model.path;
    let tokenizer = ooze_model::Tokenizer::load(model).with_context(|| {
        format!(
            "the tokenizer of {} (the model whose chat template renders the demonstrations: \
             --model or the recipe's model.path)",
            model.display()
        )
    })?;
    let shown =
        ooze_run::demonstrate::demonstrations(&recipe, std::sync::Arc::new(tokenizer), &train)?;
    Ok(shown
        .into_iter()
        .map(|d| serde_json::json!({"messages": d.messages}))
        .collect())
}

fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
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
