//! `ooze recipe-data RECIPE OUT_DIR`: writes a recipe's generated dataset in the public format the
//! recipe reads, so it can be tried with no downloads.
//!
//! - `search_r1`: `corpus.jsonl` (`{"id", "contents": "Title\ntext"}`), `train` and `test` (each
//!   as `.jsonl` and as `.parquet`, Search-R1's format) in Search-R1's row layout (`prompt`
//!   messages, `reward_model.ground_truth.target` gold answers). The facts are made up, so only
//!   searching finds the answers.
//! - `retool`: `train` and `test` (`.jsonl` and `.parquet`), multi-step arithmetic problems in the
//!   DAPO-Math / ReTool row layout (`prompt` messages, `reward_model.ground_truth`);
//!   `--task addition` writes two-number sums instead (for all four arithmetic recipes).
//! - `multi_agent`, `agentflow`, `tool_orchestra`: the same arithmetic problems in the same layout,
//!   the bare problem in `extra_info.problem` (these agents write their own prompts around it).
//! - `memagent`: long-document QA rows (`context` document, `question`, gold answers in
//!   `reward_model.ground_truth`): `train` at `--words` words per document and `test_<words>` sets
//!   at 1, 2, 4 and 8 times that, for evaluation at growing context lengths.
//! - `endless_terminals`, `echo`: generated terminal task directories (`tasks/train`,
//!   `tasks/test`, Harbor's layout) and `train`/`test` rows naming them (`extra_info.task_dir`);
//!   `swe_lite`: generated coding tasks the same way.
//! - `tau_retail`: `train.jsonl` and `test.jsonl`, customer-service scenarios over generated store
//!   databases (τ-bench's retail shape): the policy document as the system message, the scenario
//!   (database seed, the customer's hidden goal, the solution's actions) in `extra_info.scenario`.
//!   The test split's customers and databases are not in the train split.
//!
//! With `--demonstrations`, `sft.jsonl` holds demonstrations recorded from the recipe's own agent
//! ([`ooze_run::demonstrate`]): every training row runs through the agent (the recipe's TOML,
//! `--recipe`, or the shipped `recipes/RECIPE/recipe.toml`, with `--set`), with the agent type's
//! oracle writing every turn and answering for every helper, rendered with `--model`'s tokenizer
//! and chat template. Tools, searches and the agent's prompts are the real ones, so every turn
//! looks as it will in a rollout. tool_orchestra's expert conversations go to `experts.jsonl`, to
//! warm-start the expert models; every other recipe's helper conversations join `sft.jsonl`.

use super::write_jsonl;
use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// search_r1, retool, multi_agent, memagent, agentflow, tool_orchestra, endless_terminals, echo,
    /// swe_lite or tau_retail
    recipe: String,
    out: PathBuf,
    /// Questions (and facts) to write; a tenth more go to the test split.
    #[arg(long, default_value_t = 1000)]
    n: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write `sft.jsonl`: every conversation of the recipe's agent on each train row, recorded
    /// with its oracle writing the turns.
    #[arg(long)]
    demonstrations: bool,
    /// retool, multi_agent, agentflow, tool_orchestra: the problems, `arithmetic` (multi-step
    /// expressions) or `addition` (two numbers below 100).
    #[arg(long)]
    task: Option<String>,
    /// memagent: words per training document.
    #[arg(long, default_value_t = 600)]
    words: usize,
    /// Demonstrations: the recipe whose agent is run (default: the shipped
    /// `recipes/RECIPE/recipe.toml`).
    #[arg(long = "recipe")]
    recipe_file: Option<PathBuf>,
    /// Demonstrations: the model whose tokenizer and chat template render the turns (default: the
    /// recipe's `model.path`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Demonstrations: recordings per train row. The terminal oracle alternates its habit from
    /// take to take, so with 2 every task is shown solved once and abandoned once and the
    /// warm-started policy is undecided on every task (one take leaves each task's habit to a hash
    /// that SFT memorises). Other recipes' oracles do not vary: 1.
    #[arg(long, default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    takes: usize,
    /// Demonstrations: KEY=VALUE overrides of the recipe, as in `ooze train`.
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
    if !args.demonstrations
        && (args.recipe_file.is_some()
            || args.model.is_some()
            || !args.sets.is_empty()
            || args.takes != 1)
    {
        anyhow::bail!("--recipe, --model, --set and --takes apply to --demonstrations");
    }
    if args.takes != 1
        && !matches!(
            args.recipe.as_str(),
            "endless_terminals" | "echo" | "swe_lite"
        )
    {
        anyhow::bail!(
            "--takes {} applies to endless_terminals, echo and swe_lite, whose oracle alternates \
             its habit between takes; {}'s oracle would repeat itself",
            args.takes,
            args.recipe
        );
    }
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
            eprintln!(
                "wrote {} documents, {} train and {} test questions to {}",
                data.corpus.len(),
                train.len(),
                test.len(),
                args.out.display()
            );
        }
        "retool" | "multi_agent" | "agentflow" | "tool_orchestra" => math_recipe(&args)?,
        "memagent" => memagent(&args)?,
        "endless_terminals" | "echo" | "swe_lite" => terminal_recipe(&args)?,
        "tau_retail" => tau_retail(&args)?,
        other => anyhow::bail!("unknown recipe `{other}`; expected search_r1, retool, multi_agent, memagent, agentflow, tool_orchestra, endless_terminals, echo, swe_lite or tau_retail"),
    }
    if args.demonstrations {
        write_demonstrations(&args)?;
    }
    Ok(())
}

/// τ-bench-style scenarios: train and test rows.
fn tau_retail(args: &Args) -> anyhow::Result<()> {
    let test_n = (args.n / 10).max(1);
    let mut rows = ooze_agents::recipes::tau_retail::synthetic(args.n + test_n, args.seed);
    let test = rows.split_off(args.n);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    write_jsonl(&args.out.join("train.jsonl"), &rows)?;
    write_jsonl(&args.out.join("test.jsonl"), &test)?;
    eprintln!(
        "wrote {} train and {} test scenarios to {}",
        rows.len(),
        test.len(),
        args.out.display()
    );
    Ok(())
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
    eprintln!(
        "wrote {} train and {} test problems to {}",
        rows.len(),
        test.len(),
        args.out.display()
    );
    Ok(())
}

/// The terminal recipes: task directories under `tasks/train` and `tasks/test` (generated
/// terminal tasks for endless_terminals and echo, coding tasks for swe_lite; the test split from
/// another seed stream, so its parameters are new), and `train`/`test` rows pointing at them
/// (`extra_info.task_dir`).
fn terminal_recipe(args: &Args) -> anyhow::Result<()> {
    use ooze_agents::recipes::terminal::instruction;
    use ooze_env::families;
    let test_n = (args.n / 10).max(1);
    let coding = args.recipe == "swe_lite";
    let out = std::path::absolute(&args.out)
        .with_context(|| format!("resolving {}", args.out.display()))?;
    let mut splits = Vec::new();
    for (split, n, seed) in [
        ("train", args.n, args.seed),
        ("test", test_n, args.seed ^ 0x7e57),
    ] {
        let root = out.join("tasks").join(split);
        let family_list = if coding {
            families::coding_families()
        } else {
            families::terminal_families()
        };
        let dirs = families::write_tasks(&root, &family_list, n, seed)?;
        let rows: Vec<serde_json::Value> = dirs
            .iter()
            .map(|dir| {
                let task = ooze_env::Task::load(dir)?;
                Ok(serde_json::json!({
                    "prompt": [{"role": "user", "content": instruction(&task.instruction, coding)}],
                    "label": "pass",
                    "extra_info": {
                        "task_dir": dir.display().to_string(),
                        "family": task.metadata.get("family").and_then(|f| f.as_str()).unwrap_or(""),
                        "split": split,
                    },
                }))
            })
            .collect::<Result<_, ooze_env::EnvError>>()?;
        write_jsonl(&out.join(format!("{split}.jsonl")), &rows)?;
        splits.push(rows.len());
    }
    eprintln!(
        "wrote {} train and {} test {} tasks (and their rows) under {}",
        splits[0],
        splits[1],
        if coding { "coding" } else { "terminal" },
        out.display()
    );
    Ok(())
}

/// The recipes `--demonstrations` runs by default, as shipped.
const SHIPPED: [(&str, &str); 10] = [
    (
        "search_r1",
        include_str!("../../../../recipes/search_r1/recipe.toml"),
    ),
    (
        "retool",
        include_str!("../../../../recipes/retool/recipe.toml"),
    ),
    (
        "multi_agent",
        include_str!("../../../../recipes/multi_agent/recipe.toml"),
    ),
    (
        "memagent",
        include_str!("../../../../recipes/memagent/recipe.toml"),
    ),
    (
        "agentflow",
        include_str!("../../../../recipes/agentflow/recipe.toml"),
    ),
    (
        "tool_orchestra",
        include_str!("../../../../recipes/tool_orchestra/recipe.toml"),
    ),
    (
        "endless_terminals",
        include_str!("../../../../recipes/endless_terminals/recipe.toml"),
    ),
    ("echo", include_str!("../../../../recipes/echo/recipe.toml")),
    (
        "swe_lite",
        include_str!("../../../../recipes/swe_lite/recipe.toml"),
    ),
    (
        "tau_retail",
        include_str!("../../../../recipes/tau_retail/recipe.toml"),
    ),
];

/// Records the recipe's agent on the train split just written: `sft.jsonl`, and for
/// tool_orchestra the experts' conversations in `experts.jsonl`.
fn write_demonstrations(args: &Args) -> anyhow::Result<()> {
    let train = args.out.join("train.jsonl").display().to_string();
    let mut sets = vec![format!("data.path={}", toml_string(&train))];
    if let Some(model) = &args.model {
        sets.push(format!(
            "model.path={}",
            toml_string(&model.display().to_string())
        ));
    }
    if args.recipe == "search_r1" {
        // The agent searches the corpus just written.
        let corpus = args.out.join("corpus.jsonl").display().to_string();
        sets.push(format!("agent.corpus={}", toml_string(&corpus)));
    }
    sets.extend(args.sets.iter().cloned());
    let recipe = match &args.recipe_file {
        Some(path) => ooze_run::recipe::Recipe::load(path, &sets)?,
        None => {
            let (_, text) = SHIPPED
                .iter()
                .find(|(name, _)| *name == args.recipe)
                .context("every recipe has a shipped TOML")?;
            let origin = format!("recipes/{}/recipe.toml (shipped)", args.recipe);
            ooze_run::recipe::Recipe::parse(text, std::path::Path::new(&origin), &sets)?
        }
    };
    let model = &recipe.model.path;
    let tokenizer = ooze_model::Tokenizer::load(model).with_context(|| {
        format!(
            "the tokenizer of {} (the model whose tokenizer and chat template render the \
             demonstrations: --model, or the recipe's model.path)",
            model.display()
        )
    })?;
    let shown = ooze_run::demonstrate::demonstrations(
        &recipe,
        std::sync::Arc::new(tokenizer),
        &train,
        args.takes,
    )?;
    let experts_apart = args.recipe == "tool_orchestra";
    let (mut policy, mut experts) = (Vec::new(), Vec::new());
    for d in shown {
        let row = serde_json::json!({"messages": d.messages});
        if experts_apart && d.caller != "policy" {
            experts.push(row);
        } else {
            policy.push(row);
        }
    }
    write_jsonl(&args.out.join("sft.jsonl"), &policy)?;
    if experts_apart {
        write_jsonl(&args.out.join("experts.jsonl"), &experts)?;
    }
    eprintln!(
        "wrote {} demonstrations{} to {}",
        policy.len(),
        if experts_apart {
            format!(" and {} expert conversations", experts.len())
        } else {
            String::new()
        },
        args.out.display()
    );
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn run_with(words: &[&str]) -> anyhow::Result<()> {
        let cli = Cli::try_parse_from(std::iter::once("recipe-data").chain(words.iter().copied()))?;
        run(cli.args)
    }

    #[test]
    fn demonstration_options_need_demonstrations_and_a_model() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("data");
        let o = out.to_str().unwrap();
        // Refused before anything is written.
        let e = run_with(&["retool", o, "--n", "5", "--model", "m"]).unwrap_err();
        assert!(e.to_string().contains("apply to --demonstrations"), "{e}");
        let e = run_with(&["retool", o, "--demonstrations", "--takes", "2"]).unwrap_err();
        assert!(
            e.to_string()
                .contains("endless_terminals, echo and swe_lite"),
            "{e}"
        );
        let e = run_with(&["swe_lite", o, "--demonstrations", "--takes", "0"]).unwrap_err();
        assert!(e.to_string().contains("--takes"), "{e}");
        assert!(!out.exists());
        // Without --model, the shipped recipe's model.path (not there yet) is named.
        let e = run_with(&["retool", o, "--n", "5", "--demonstrations"]).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("--model") && e.contains("target/retool/sft/final-model"),
            "{e}"
        );
    }
}
