//! Demonstrations for a recipe's agent, recorded from the agent itself: each training prompt runs
//! through the recipe's own agent (its settings, the model's chat template, real tools) with the
//! agent type's oracle writing every turn and playing every helper ([`ooze_rollout::oracle`]).
//! `ooze recipe-data … --demonstrations` writes them for `ooze sft`.

use crate::agents::{agent_rollout, scripted_helpers};
use crate::prepare::{data_config, prompt_format};
use crate::recipe::{AgentSection, Recipe};
use anyhow::{bail, Context};
use ooze_model::Tokenizer;
use ooze_rollout::oracle::{demonstrate, Demonstration, Oracle};
use ooze_rollout::prompts::{prepare, PromptItem};
use std::sync::Arc;

/// Executions run at once (each may wait on the sandbox): two per core, 8 to 64.
fn at_once() -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    (2 * cores).clamp(8, 64)
}

/// The agent type's oracle for one prompt, in its `take`-th recording (0 for the first).
fn oracle(
    agent: &AgentSection,
    prompt: &PromptItem,
    take: usize,
) -> anyhow::Result<Arc<dyn Oracle>> {
    use ooze_agents::recipes::{
        agentflow, memagent, multi_agent, retool, search_r1, tau_retail, terminal, tool_orchestra,
    };
    Ok(match agent {
        AgentSection::None => bail!("the recipe has no [agent]"),
        AgentSection::SearchR1(_) => Arc::new(search_r1::SearchR1Oracle::new(prompt)?),
        AgentSection::Retool(_) => Arc::new(retool::RetoolOracle::new(prompt)?),
        AgentSection::MultiAgent(_) => Arc::new(multi_agent::MultiAgentOracle::new(prompt)?),
        AgentSection::Memagent(_) => Arc::new(memagent::MemAgentOracle::new(prompt)?),
        AgentSection::Agentflow(_) => Arc::new(agentflow::AgentflowOracle::new(prompt)?),
        AgentSection::ToolOrchestra(_) => Arc::new(tool_orchestra::OrchestraOracle::new(prompt)?),
        AgentSection::Terminal(_) => Arc::new(terminal::TerminalOracle::new(prompt, take)?),
        AgentSection::TauRetail(_) => Arc::new(tau_retail::TauRetailOracle::new(prompt)?),
        AgentSection::Command(_) => bail!(
            "agent.type = \"command\" has no built-in oracle to demonstrate it: give `ooze sft` \
             chat demonstrations of your own (a JSONL file of {{\"messages\": [...]}} rows)"
        ),
    })
}

/// Every conversation of the recipe's agent on each prompt of the data file `path` (read with
/// the recipe's `[data]` keys), in prompt order, each prompt recorded `takes` times in a row.
/// Only the terminal agent's oracle varies between takes (it alternates its habit), so other
/// agents take one. Progress goes to stderr.
pub fn demonstrations(
    recipe: &Recipe,
    tokenizer: Arc<Tokenizer>,
    path: &str,
    takes: usize,
) -> anyhow::Result<Vec<Demonstration>> {
    let Some(spec) = recipe.agent.spec() else {
        bail!("the recipe has no [agent]: demonstrations are an agent's conversations");
    };
    if takes == 0 {
        bail!("takes must be at least 1");
    }
    if takes > 1 && !matches!(recipe.agent, AgentSection::Terminal(_)) {
        bail!(
            "{takes} takes per prompt: only the terminal agent's oracle (endless_terminals, echo, \
             swe_lite) differs between takes; this agent's would repeat itself"
        );
    }
    let rows = ooze_rollout::data::load(&data_config(recipe, path))?.rows;
    let (prompts, too_long) = prepare(
        rows,
        &tokenizer,
        &prompt_format(recipe),
        recipe.data.max_prompt_tokens,
        path,
    )
    .map_err(anyhow::Error::msg)?;
    if too_long > 0 {
        eprintln!(
            "demonstrations: {too_long} rows of {path} skipped: their prompts are longer than \
             data.max_prompt_tokens = {}",
            recipe.data.max_prompt_tokens
        );
    }
    if prompts.is_empty() {
        bail!(
            "{path}: no prompt to demonstrate (every prompt is longer than \
             data.max_prompt_tokens = {})",
            recipe.data.max_prompt_tokens
        );
    }
    let continues_the_prompt = matches!(
        recipe.agent,
        AgentSection::SearchR1(_) | AgentSection::Retool(_)
    );
    if continues_the_prompt && prompts.iter().any(|p| p.messages.is_empty()) {
        bail!(
            "{path}: this agent continues the row's rendered prompt, and demonstrations are chat \
             messages: the prompts must be chat messages (data.apply_chat_template = true)"
        );
    }
    let helpers = scripted_helpers(recipe);
    let longest = prompts.iter().map(|p| p.input_ids.len()).max().unwrap_or(0);
    let rollout = agent_rollout(recipe, longest + spec.context_len(), None)?
        .context("the recipe has no [agent]")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = std::time::Instant::now();
    let jobs = prompts.len() * takes;
    let mut out: Vec<Vec<Demonstration>> = vec![Vec::new(); jobs];
    runtime.block_on(async {
        let mut running = tokio::task::JoinSet::new();
        let mut next = 0;
        let mut done = 0;
        let at_once = at_once();
        while done < jobs {
            while next < jobs && running.len() < at_once {
                let (prompt, take) = (prompts[next / takes].clone(), next % takes);
                let oracle = oracle(&recipe.agent, &prompt, take)?;
                let (agent, limits, tokenizer, helpers) = (
                    rollout.agent.clone(),
                    rollout.limits.clone(),
                    tokenizer.clone(),
                    helpers.clone(),
                );
                running.spawn(async move {
                    let shown =
                        demonstrate(&*agent, oracle, &tokenizer, &limits, helpers, &prompt).await;
                    (next, prompt.source_line, shown)
                });
                next += 1;
            }
            let (i, line, shown) = running.join_next().await.expect("tasks are running")?;
            out[i] = shown.with_context(|| format!("{path}:{line}: the demonstration failed"))?;
            done += 1;
            if done % 100 == 0 || done == jobs {
                eprintln!(
                    "demonstrations: {done}/{jobs} recordings of {} prompts ({:.0}s)",
                    prompts.len(),
                    started.elapsed().as_secs_f64()
                );
            }
        }
        anyhow::Ok(())
    })?;
    Ok(out.into_iter().flatten().collect())
}
