//! The `[agent]` and `[helpers.NAME]` rows of the table. The limits, the sandbox's slots, the
//! fan-out, the chunking and the cost-aware reward act on every execution and are asserted on a
//! random policy; search_r1's and retool's tool keys, their turn limits, the format reward and
//! the observation term run on models the harness warm-starts on each agent's demonstrations
//! (they search and call the interpreter). The other agents fail every execution with a random
//! policy: their keys that act on a tool or expert call stay untested with that reason.

use super::cases::{Case, Obs};

/// `[agent]` of `ty` with small turns (`extra`: more `key = value` pairs), and the helpers it needs.
fn agent(ty: &str, extra: &str) -> Vec<String> {
    let mut keys = vec![
        ("type", format!("\"{ty}\"")),
        ("max_tokens_per_turn", "6".into()),
        ("max_response_tokens", "64".into()),
    ];
    for pair in extra.split(", ").filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once(" = ").unwrap();
        keys.retain(|(key, _)| *key != k);
        keys.push((k, v.into()));
    }
    let body: Vec<String> = keys.iter().map(|(k, v)| format!("{k} = {v}")).collect();
    let mut sets = vec![format!("agent={{{}}}", body.join(", "))];
    match ty {
        "search_r1" => {
            sets[0].pop();
            sets[0].push_str(", corpus = \"{corpus}\"}");
        }
        "memagent" => sets.push("data={path = \"{mem_data}\", metadata_key = \"*\"}".into()),
        "agentflow" => {
            for h in ["executor", "verifier", "generator", "judge"] {
                sets.push(format!("helpers.{h}={{policy = true, max_tokens = 4}}"));
            }
        }
        "tool_orchestra" => sets.push("helpers.expert={policy = true, max_tokens = 4}".into()),
        _ => {}
    }
    sets
}

/// [`agent`] of `ty` (search_r1 or retool) on the harness's warm-started model and its data, with
/// turns long enough for a tool call.
fn warm(ty: &str, extra: &str) -> Vec<String> {
    let dir = format!("{{warm_{ty}}}");
    let label = match ty {
        "search_r1" => "reward_model.ground_truth.target",
        _ => "reward_model.ground_truth",
    };
    let extra = format!("max_tokens_per_turn = 48, max_response_tokens = 192, {extra}");
    let mut sets = agent(ty, extra.trim_end_matches(", "));
    sets[0] = sets[0].replace("{corpus}", &format!("{dir}/data/corpus.jsonl"));
    sets.push(format!("model.path=\"{dir}/sft/final-model\""));
    sets.push(format!(
        "data={{path = \"{dir}/data/train.jsonl\", input_key = \"prompt\", label_key = \"{label}\"}}"
    ));
    sets
}

fn case(keys: &[&str], base: Vec<String>, sets: Vec<String>, obs: Obs) -> Case {
    Case {
        keys: keys.iter().map(|s| s.to_string()).collect(),
        base,
        sets,
        obs,
    }
}

const TOOL: &str = "acts on a tool call, which a random policy does not write";

pub fn cases() -> Vec<Case> {
    use Obs::*;
    let mut c = vec![case(
        &["agent.type"],
        vec![],
        agent("retool", ""),
        Metric("agent/turns"),
    )];
    for ty in [
        "search_r1",
        "retool",
        "multi_agent",
        "memagent",
        "agentflow",
        "tool_orchestra",
    ] {
        let key = |k: &str| format!("agent({ty}).{k}");
        let one = |k: &str, extra: &str, obs: Obs| {
            case(
                &[&key(k)],
                agent(ty, ""),
                agent(ty, extra.trim_start_matches(", ")),
                obs,
            )
        };
        c.push(one(
            "max_tokens_per_turn",
            ", max_tokens_per_turn = 2",
            Metric("rollout/response_len_max"),
        ));
        c.push(one(
            "max_response_tokens",
            ", max_response_tokens = 3",
            Metric("rollout/response_len_max"),
        ));
        // Past the deadline a turn generates nothing: the executions that succeed end empty.
        c.push(one("deadline_secs", ", deadline_secs = 1e-4", Responses));
        // multi_agent's and memagent's turns are fixed by their structure (no max_turns key).
        // (search_r1's and retool's: below, on a warm-started model.)
        if !matches!(ty, "multi_agent" | "memagent" | "search_r1" | "retool") {
            c.push(one("max_turns", ", max_turns = 1", Metric("agent/turns")));
        }
    }
    let untested = |keys: &[&str], why: &'static str| case(keys, vec![], vec![], Untested(why));
    c.extend([
        case(
            &["agent(search_r1).corpus"],
            agent("search_r1", ""),
            agent("search_r1", "")
                .into_iter()
                .map(|s| s.replace("{corpus}", "{dir}/none.jsonl"))
                .collect(),
            Fails("none.jsonl"),
        ),
        case(
            &["agent(retool).tool_concurrency"],
            agent("retool", ""),
            agent("retool", ", tool_concurrency = 3"),
            Stderr("3 programs at once"),
        ),
        case(
            &["agent(multi_agent).solvers"],
            agent("multi_agent", ""),
            agent("multi_agent", ", solvers = 1"),
            Metric("agent/samples_per_execution"),
        ),
        case(
            &["agent(memagent).chunk_tokens"],
            agent("memagent", ""),
            agent("memagent", ", chunk_tokens = 40"),
            Metric("agent/chunks"),
        ),
        untested(
            &[
                "agent(agentflow).max_observation_tokens",
                "agent(agentflow).tool_timeout_secs",
                "agent(agentflow).tool_memory_mb",
            ],
            TOOL,
        ),
        case(
            &["agent(agentflow).tool_concurrency"],
            agent("agentflow", ""),
            agent("agentflow", ", tool_concurrency = 3"),
            Stderr("3 programs at once"),
        ),
        untested(
            &[
                "agent(tool_orchestra).max_observation_tokens",
                "agent(tool_orchestra).tool_timeout_secs",
                "agent(tool_orchestra).tool_memory_mb",
                "agent(tool_orchestra).corpus",
                "agent(tool_orchestra).retrieval_url",
                "agent(tool_orchestra).topk",
                "agent(tool_orchestra).experts",
                "agent(tool_orchestra).cost_weight",
            ],
            TOOL,
        ),
        case(
            &["agent(tool_orchestra).tool_concurrency"],
            agent("tool_orchestra", ""),
            agent("tool_orchestra", ", tool_concurrency = 3"),
            Stderr("3 programs at once"),
        ),
        case(
            &["agent(tool_orchestra).latency_scale_secs"],
            agent("tool_orchestra", ""),
            agent("tool_orchestra", ", latency_scale_secs = 1e-9"),
            Metric("reward/mean"),
        ),
        case(
            &["agent(tool_orchestra).max_penalty"],
            agent("tool_orchestra", ", latency_scale_secs = 1e-9"),
            agent(
                "tool_orchestra",
                ", latency_scale_secs = 1e-9, max_penalty = 0.1",
            ),
            Metric("reward/mean"),
        ),
    ]);
    // search_r1 and retool on models warm-started on their demonstrations: they search and
    // call the interpreter.
    let sr = |extra: &str| warm("search_r1", extra);
    let rt = |extra: &str| warm("retool", extra);
    let fmt = |f: &str| sr(&format!("format_reward = {{{f}}}"));
    let unreachable = sr("")
        .into_iter()
        .map(|s| {
            s.replace(
                "corpus = \"{warm_search_r1}/data/corpus.jsonl\"",
                "retrieval_url = \"http://127.0.0.1:9/retrieve\"",
            )
        })
        .collect();
    let mut observed = sr("");
    observed.push("algorithm.loss.observation_coef=0.05".into());
    c.extend([
        case(
            &["agent(search_r1).max_turns"],
            sr(""),
            sr("max_turns = 1"),
            Metric("agent/turns"),
        ),
        case(
            &["agent(search_r1).topk"],
            sr(""),
            sr("topk = 1"),
            Responses,
        ),
        case(
            &["agent(search_r1).max_observation_tokens"],
            sr(""),
            sr("max_observation_tokens = 4"),
            Responses,
        ),
        case(
            &["agent(search_r1).retrieval_url"],
            sr(""),
            unreachable,
            Responses,
        ),
        case(
            &["algorithm.loss.observation_coef"],
            sr(""),
            observed,
            Metric("train/observation_loss"),
        ),
        case(
            &["agent(search_r1).format_reward.structure"],
            fmt(""),
            fmt("structure = 0.5"),
            Metric("reward/mean"),
        ),
        case(
            &["agent(search_r1).format_reward.final_format"],
            fmt(""),
            fmt("final_format = 0.5"),
            Metric("reward/mean"),
        ),
        case(
            &["agent(search_r1).format_reward.retrieval"],
            fmt(""),
            fmt("retrieval = 0.5"),
            Metric("reward/mean"),
        ),
        case(
            &["agent(retool).max_turns"],
            rt(""),
            rt("max_turns = 1"),
            Metric("agent/turns"),
        ),
        case(
            &["agent(retool).max_observation_tokens"],
            rt(""),
            rt("max_observation_tokens = 3"),
            Responses,
        ),
        case(
            &["agent(retool).tool_timeout_secs"],
            rt(""),
            rt("tool_timeout_secs = 1e-3"),
            Responses,
        ),
        case(
            &["agent(retool).tool_memory_mb"],
            rt(""),
            rt("tool_memory_mb = 1"),
            Responses,
        ),
    ]);
    // [helpers.NAME], through agentflow's judge (called on every execution's answer).
    let flow = agent("agentflow", "");
    let judge = |h: &str| {
        let mut s = flow.clone();
        s.retain(|x| !x.starts_with("helpers.judge="));
        s.push(format!("helpers.judge={{{h}}}"));
        s
    };
    let helper = |k: &str, h: &str, obs: Obs| {
        case(&[&format!("helpers.NAME.{k}")], flow.clone(), judge(h), obs)
    };
    c.extend([
        helper("policy", "policy = true, max_tokens = 4, timeout_secs = 1e-9", Fails("")),
        helper("path", "path = \"{model2}\", max_tokens = 4", Metric("reward/mean")),
        helper("url", "url = \"{teacher}/v1\", max_tokens = 4", Metric("agent/helper/judge/seconds")),
        helper("max_tokens", "policy = true, max_tokens = 1", Metric("agent/helper/judge/tokens")),
        helper("temperature", "policy = true, max_tokens = 4, temperature = 1.0", Metric("reward/mean")),
        helper("timeout_secs", "policy = true, max_tokens = 4, timeout_secs = 1e-9", Metric("agent/failed_frac")),
        helper("price_per_million_tokens", "policy = true, max_tokens = 4, price_per_million_tokens = 1e5", Metric("agent/helper/judge/cost")),
        helper("model", "url = \"{teacher}/v1\", max_tokens = 4, model = \"nope\"", Metric("agent/failed_frac")),
        helper("api_key_env", "url = \"{teacher}/v1\", max_tokens = 4, api_key_env = \"OOZE_TEST_NO_SUCH_KEY\"", Fails("OOZE_TEST_NO_SUCH_KEY")),
        helper("slots", "path = \"{model2}\", max_tokens = 4, slots = 1", Stderr("1 sequences")),
        untested(&["helpers.NAME.description"], "shown where the policy is offered models as tools (tool_orchestra's expert list); a random policy never calls one"),
    ]);
    c
}
