//! The agent recipes through `ooze train` on the CPU: generated data, a tiny model warm-started on
//! worked trajectories, two RL steps; then the saved trajectories are checked token by token:
//! mask 1 exactly on the engine's tokens, appended text whole and masked, no trained token after
//! a stop tag, one sample per execution, eval through the agent.

mod common;
#[path = "agent_recipes/harness.rs"]
mod harness;

use harness::*;
use serde_json::Value;

#[test]
fn search_r1_trains_on_exact_trajectories() {
    // Search-R1's own format: the generated Parquet files. With the observation (world-model)
    // term on: it trains on the retrieved documents' tokens.
    let run = run_recipe(
        "search_r1",
        "parquet",
        &[
            "agent.corpus=\"{data}/corpus.jsonl\"".to_string(),
            "algorithm.loss.observation_coef=0.05".to_string(),
        ],
    );
    let ok = |t: &str| {
        (t.starts_with("\n\n<information>") && t.ends_with("</information>\n\n"))
            || t.contains("[Invalid action.")
    };
    let searches = check_trajectories(&run, &ok, "<information>", "</search>");
    prompts_are_demonstrated(&run, "", "");
    observations_are_demonstrated(
        &run,
        "<information>",
        "</information>",
        "No documents matched",
    );
    assert!(
        searches > 0,
        "the warm-started model searched at least once"
    );
    let trained: Vec<&Value> = run
        .metrics
        .iter()
        .filter(|m| m["rollout"].as_u64() > Some(0))
        .collect();
    assert!(
        trained.iter().any(|m| m["train/observation_loss"]
            .as_f64()
            .is_some_and(|l| l > 0.0)),
        "the observation term trains on the retrieved text: {trained:?}"
    );
    // The observation mask covers the environment's text only: every observed span decodes
    // to text inside an appended block.
    let text = std::fs::read_to_string(run.dir.join("rollouts/rollout-000001.jsonl")).unwrap();
    let mut observed = 0;
    for line in text.lines() {
        let group: Value = serde_json::from_str(line).unwrap();
        for sample in group["samples"].as_array().unwrap() {
            let Some(mask) = sample.get("observation_mask") else {
                continue;
            };
            let mask: Vec<u64> = mask
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_u64().unwrap())
                .collect();
            let loss: Vec<u64> = sample["loss_mask"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_u64().unwrap())
                .collect();
            for (o, l) in mask.iter().zip(&loss) {
                assert!(*o == 0 || *l == 0, "an observed token is never trained");
            }
            observed += mask.iter().filter(|&&o| o == 1).count();
        }
    }
    assert!(observed > 0, "some tokens were observations");
}

#[test]
fn retool_trains_on_exact_trajectories() {
    let run = run_recipe("retool", "jsonl", &[]);
    let ok = |t: &str| t.starts_with("\n<interpreter>\n") && t.ends_with("\n</interpreter>\n");
    let calls = check_trajectories(&run, &ok, "<interpreter>", "</tool_call>");
    prompts_are_demonstrated(&run, "", "");
    observations_are_demonstrated(&run, "<interpreter>", "</interpreter>", "Error");
    assert!(
        calls > 0,
        "the warm-started model called the interpreter at least once"
    );
    // The ReTool reward: +1, or at most −0.6.
    for m in run
        .metrics
        .iter()
        .filter(|m| m["rollout"].as_u64() > Some(0))
    {
        assert!(m["agent/tool_calls"].as_f64().unwrap() > 0.0, "{m}");
        let r = m["reward/mean"].as_f64().unwrap();
        assert!((-1.2..=1.0).contains(&r), "{m}");
    }
}

#[test]
fn multi_agent_trains_every_call_as_a_sibling() {
    let run = run_recipe_with(
        "multi_agent",
        "parquet",
        &["--set", "agent.solvers=2"],
        &["agent.solvers=2".to_string()],
        |_| Vec::new(),
    );
    prompts_are_demonstrated(&run, "", "");
    for siblings in executions(&run) {
        // 2 solvers, 2 rewriters, 1 selector.
        assert_eq!(siblings.len(), 5);
        let r = rewards(&siblings);
        // Per-sample rewards 0/1, scaled by 1.2 when the selected answer is right, else 0.8.
        let scale = if r[4] > 0.0 { 1.2 } else { 0.8 };
        for x in &r {
            assert!(*x == 0.0 || (*x - scale).abs() < 1e-12, "{r:?}");
        }
    }
    assert!(run.metrics[0]["eval/test/pass@1"].is_number());
}

#[test]
fn memagent_reads_in_chunks_and_broadcasts_the_reward() {
    let run = run_recipe_with(
        "memagent",
        "parquet",
        &[
            "--words",
            "150",
            "--set",
            "agent.chunk_tokens=128",
            "--set",
            "agent.max_tokens_per_turn=24",
        ],
        &[
            "agent.chunk_tokens=128".to_string(),
            "agent.max_tokens_per_turn=24".to_string(),
            "eval.datasets=[{name = \"words_150\", path = \"{data}/test_150.parquet\", n_samples = 2, pass_k = [1]}, {name = \"words_600\", path = \"{data}/test_600.parquet\", n_samples = 2, pass_k = [1]}]".to_string(),
        ],
        |_| Vec::new(),
    );
    prompts_are_demonstrated(&run, "", "");
    // The demonstrations read sections as long as the run's chunks (values are masked above).
    let longest_section = |prompts: Vec<String>| {
        prompts
            .iter()
            .filter_map(|p| p.split_once("\nSection:\n"))
            .map(|(_, rest)| {
                let section = rest.split("\nNew memory:").next().unwrap();
                run.tokenizer.encode(section, false).unwrap().len()
            })
            .max()
            .unwrap()
    };
    let demonstrated = demonstrations(&run, "")
        .iter()
        .map(|m| m[0]["content"].as_str().unwrap().to_owned())
        .collect();
    let seen = rollout_samples(&run)
        .iter()
        .map(|(_, s)| {
            let prompt = run.tokenizer.decode(&token_ids(&s["prompt_ids"]), false);
            prompt.unwrap()
        })
        .collect();
    let (demonstrated, seen) = (longest_section(demonstrated), longest_section(seen));
    assert!(
        demonstrated.abs_diff(seen) <= 2,
        "{demonstrated} vs {seen} tokens"
    );
    for siblings in executions(&run) {
        let chunks = siblings[0]["agent_metrics"]["chunks"].as_f64().unwrap() as usize;
        // One sample per memory update, plus the answer.
        assert!(chunks >= 2, "{chunks}");
        assert_eq!(siblings.len(), chunks + 1);
        let r = rewards(&siblings);
        assert!(
            r.iter().all(|x| *x == r[0]) && (r[0] == 0.0 || r[0] == 1.0),
            "{r:?}"
        );
    }
    // Evaluated at two context lengths, at the start and the end.
    for m in [&run.metrics[0], run.metrics.last().unwrap()] {
        assert!(m["eval/words_150/pass@1"].is_number(), "{m}");
        assert!(m["eval/words_600/pass@1"].is_number(), "{m}");
    }
}

#[test]
fn agentflow_plans_with_fixed_helpers_and_an_http_judge() {
    let mut judge = None;
    let run = run_recipe_with(
        "agentflow",
        "jsonl",
        &[],
        &[
            "helpers.executor.path=\"{model}\"".to_string(),
            "helpers.verifier={policy = true, max_tokens = 8}".to_string(),
            "helpers.generator={policy = true, max_tokens = 32}".to_string(),
            "agent.max_turns=2".to_string(),
            "agent.max_tokens_per_turn=160".to_string(),
        ],
        |model| {
            // The judge is an OpenAI-compatible server: `ooze serve` on the warm-started model.
            let (server, url) = common::serve(model, &["--context-len", "2048"]);
            judge = Some(server);
            vec![format!("helpers.judge={{url = \"{url}\", max_tokens = 8}}")]
        },
    );
    drop(judge);
    // Every planner prompt of the rollouts, its values masked, has the shape of a demonstrated one.
    prompts_are_demonstrated(&run, "You plan the next step", "");
    for siblings in executions(&run) {
        let m = &siblings[0]["agent_metrics"];
        let steps = m["steps"].as_f64().unwrap() as usize;
        // One sample per planner call; the judge was asked once per execution, over HTTP.
        assert!((1..=2).contains(&steps), "{m}");
        assert_eq!(siblings.len(), steps);
        assert_eq!(m["helper/judge/calls"], 1.0, "{m}");
        assert!(m["helper/judge/tokens"].as_f64().unwrap() > 0.0, "{m}");
        assert_eq!(m["helper/generator/calls"], 1.0, "{m}");
        let r = rewards(&siblings);
        assert!(
            r.iter().all(|x| *x == r[0]) && (r[0] == 0.0 || r[0] == 1.0),
            "{r:?}"
        );
    }
}

#[test]
fn tool_orchestra_pays_for_its_experts() {
    let run = run_recipe(
        "tool_orchestra",
        "jsonl",
        &[
            // The recipe's experts (as the demonstrations show them), served by the policy's
            // engine and by an engine of their own.
            "helpers.small={policy = true, price_per_million_tokens = 0.2, description = \"a small, fast model\"}".to_string(),
            "helpers.large.path=\"{model}\"".to_string(),
            "agent.max_turns=2".to_string(),
            "agent.max_tokens_per_turn=48".to_string(),
            // Every group is trained here (the filter itself is tested in the manager).
            "rollout.dynamic_sampling=false".to_string(),
            "rollout.min_reward_std=0".to_string(),
        ],
    );
    prompts_are_demonstrated(&run, "", "Earlier attempts:");
    let mut paid = 0;
    for siblings in executions(&run) {
        let m = &siblings[0]["agent_metrics"];
        assert_eq!(siblings.len(), m["turns"].as_f64().unwrap() as usize, "{m}");
        // Generation stops at the call's closing tag: nothing after it is trained.
        for sample in &siblings {
            let text = sample["response"].as_str().unwrap();
            if let Some(at) = text.find("</tool_call>") {
                assert_eq!(at + "</tool_call>".len(), text.len(), "{text:?}");
            }
        }
        // The efficiency reward, from the execution's own cost and latency.
        let (correct, cost, latency) = (
            m["correct"].as_f64().unwrap(),
            m["cost"].as_f64().unwrap(),
            m["latency_secs"].as_f64().unwrap(),
        );
        let expected = correct - (5.0 * cost + latency / 500.0).min(0.8);
        for r in rewards(&siblings) {
            assert!((r - expected).abs() < 1e-9, "{r} vs {expected}: {m}");
        }
        if cost > 0.0 {
            paid += 1;
            let calls: f64 = ["small", "large"]
                .iter()
                .map(|e| m[format!("helper/{e}/calls")].as_f64().unwrap_or(0.0))
                .sum();
            assert!(calls >= 1.0, "{m}");
        }
    }
    assert!(
        paid > 0,
        "the warm-started orchestrator called an expert at least once"
    );
}

#[test]
fn endless_terminals_trains_ppo_on_exact_trajectories() {
    let run = run_recipe_with(
        "endless_terminals",
        "jsonl",
        &["--takes", "2"],
        &[
            "agent.max_turns=3".to_string(),
            "agent.max_tokens_per_turn=64".to_string(),
        ],
        |_| Vec::new(),
    );
    // Two takes of every task, one solving it and one looking and stopping.
    let shown: Vec<Value> = std::fs::read_to_string(run.data.join("sft.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(shown.len(), 80, "40 tasks, two takes each");
    for pair in shown.chunks(2) {
        let first_turn = |d: &Value| {
            let messages = d["messages"].as_array().unwrap();
            let at = messages
                .iter()
                .position(|m| m["role"] == "assistant")
                .unwrap();
            let turn = messages[at]["content"].as_str().unwrap().to_owned();
            (messages[..at].to_vec(), turn)
        };
        let (one, other) = (first_turn(&pair[0]), first_turn(&pair[1]));
        assert_eq!(one.0, other.0, "the same task");
        let looks = |turn: &(Vec<Value>, String)| turn.1.contains(r#""command":"ls /work"}"#);
        assert_ne!(looks(&one), looks(&other), "{pair:?}");
    }
    let actions = check_terminal_run(&run);
    assert!(
        actions > 0,
        "the warm-started model ran at least one command"
    );
    // PPO with a critic: the critic trained beside the policy.
    let last = run.metrics.last().unwrap();
    assert!(
        last["train/value_loss"].is_number() && last["train/critic_lr"].is_number(),
        "{last}"
    );
}

#[test]
fn echo_trains_on_the_terminals_observations() {
    let run = run_recipe(
        "echo",
        "jsonl",
        &[
            "agent.max_turns=3".to_string(),
            "agent.max_tokens_per_turn=64".to_string(),
        ],
    );
    check_terminal_run(&run);
    assert!(
        run.metrics
            .iter()
            .filter(|m| m["rollout"].as_u64() > Some(0))
            .any(|m| m["train/observation_loss"]
                .as_f64()
                .is_some_and(|l| l > 0.0)),
        "the observation term trains on what the terminal returned"
    );
}

#[test]
fn swe_lite_trains_on_exact_trajectories() {
    let run = run_recipe(
        "swe_lite",
        "jsonl",
        &[
            "agent.max_turns=3".to_string(),
            "agent.max_tokens_per_turn=96".to_string(),
        ],
    );
    check_terminal_run(&run);
}

#[test]
fn tau_retail_serves_a_simulated_customer_and_grades_the_database() {
    use ooze_agents::retail::{tools, Database, Scenario};
    let run = run_recipe(
        "tau_retail",
        "jsonl",
        &[
            // The customer: the warm-started model, frozen, in an engine of its own.
            "helpers.user.path=\"{model}\"".to_string(),
            "helpers.user.max_tokens=48".to_string(),
            "agent.max_turns=6".to_string(),
            "agent.max_tokens_per_turn=96".to_string(),
        ],
    );
    // Every appended span is one templated message: a tool's result or the customer's reply,
    // ending with the generation prompt of the agent's next turn.
    let ok = |t: &str| {
        let body = t.trim_start_matches("<|im_end|>").trim_start_matches('\n');
        body.starts_with("<|im_start|>user\n")
            && body.ends_with("<|im_start|>assistant\n")
            && body.matches("<|im_start|>").count() == 2
    };
    let tool_results = check_trajectories(&run, &ok, "<tool_response>", "</tool_call>");
    assert!(tool_results > 0, "the warm-started agent called a tool");
    let (mut user_turns, mut matched) = (0.0, 0);
    for k in 1..=2 {
        let text = std::fs::read_to_string(run.dir.join(format!("rollouts/rollout-{k:06}.jsonl")))
            .unwrap();
        for line in text.lines() {
            let group: Value = serde_json::from_str(line).unwrap();
            let scenario = Scenario::from_metadata(&group["prompt"]["metadata"]).unwrap();
            for sample in group["samples"].as_array().unwrap() {
                let m = &sample["agent_metrics"];
                user_turns += m["user_turns"].as_f64().unwrap();
                // The reward is τ-bench's: replaying the agent's own tool calls (its trained
                // tokens) on a fresh database gives the database it was graded on.
                let ids = token_ids(&sample["response_ids"]);
                let mask: Vec<u64> = token_ids(&sample["loss_mask"])
                    .into_iter()
                    .map(u64::from)
                    .collect();
                let mut db = Database::generate(scenario.db_seed);
                for (a, b, m) in runs(&mask) {
                    if m == 1 {
                        let turn = run.tokenizer.decode(&ids[a..b], false).unwrap();
                        if let Some(Ok(call)) =
                            ooze_agents::parse::tool_calls(&turn).into_iter().next()
                        {
                            let _ = tools::call(&mut db, &call.name, &call.arguments);
                        }
                    }
                }
                let same = db == scenario.goal_database().unwrap();
                assert_eq!(
                    m["database_matches"].as_f64(),
                    Some(same as u8 as f64),
                    "{m}"
                );
                matched += same as usize;
                let reward = sample["reward"].as_f64().unwrap();
                assert_eq!(reward, m["passed"].as_f64().unwrap(), "{m}");
                assert!(reward == 0.0 || same || scenario.actions.is_empty(), "{m}");
                assert!(m["helper/user/calls"].as_f64().unwrap() >= 1.0, "{m}");
            }
        }
    }
    assert!(
        user_turns > 0.0,
        "the agent wrote to the customer, who answered"
    );
    eprintln!("{matched} of 32 executions left the goal's database");
    // Effective concurrency over each rollout: the executions alive, generating, waiting on the
    // customer; with its series saved beside the rollout.
    for m in run
        .metrics
        .iter()
        .filter(|m| m["rollout"].as_u64() > Some(0))
    {
        let alive = m["concurrency/alive_max"].as_f64().unwrap();
        assert!((1.0..=16.0).contains(&alive), "{m}");
        assert!(
            m["concurrency/generating_max"].as_f64().unwrap() >= 1.0,
            "{m}"
        );
        assert!(m["concurrency/helper_max"].as_f64().unwrap() >= 1.0, "{m}");
        let k = m["rollout"].as_u64().unwrap();
        let activity: Value = serde_json::from_str(
            &std::fs::read_to_string(run.dir.join(format!("activity/rollout-{k:06}.json")))
                .unwrap(),
        )
        .unwrap();
        let series = activity["series"].as_array().unwrap();
        assert!(!series.is_empty());
        for point in series {
            let [alive, generating, helper] = [0, 1, 2].map(|i| point[i].as_u64().unwrap());
            assert!(generating + helper <= alive, "{point}");
        }
    }
}
