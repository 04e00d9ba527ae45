//! The `[agent]` and `[helpers.NAME]` rows of the table. The limits, the sandbox's slots, the
//! fan-out, the chunking, the expert list and the helpers' own keys act on every execution and
//! are asserted on a random policy. Keys that act on a tool, search or expert call run on models
//! the harness warm-starts on each agent's demonstrations (they search, call the interpreter,
//! plan python_coder steps, call experts); agentflow's and tool_orchestra's fixed modules are then
//! the harness's scripted expert, an OpenAI endpoint that writes Python, queries and answers.
//! The command agent's keys act on the harness's agent program (`command_agent.py`).

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
        "command" => {
            sets[0].pop();
            sets[0].push_str(", command = [\"python3\", \"{command_agent}\"]}");
        }
        "memagent" => sets.push("data={path = \"{mem_data}\", metadata_key = \"*\"}".into()),
        // These agents read the problem text from the row's metadata.
        "multi_agent" => sets.push(PROBLEMS.into()),
        "agentflow" => {
            sets.push(PROBLEMS.into());
            for h in ["executor", "verifier", "generator", "judge"] {
                sets.push(format!("helpers.{h}={{policy = true, max_tokens = 4}}"));
            }
        }
        "tool_orchestra" => {
            sets.push(PROBLEMS.into());
            sets.push("helpers.expert={policy = true, max_tokens = 4}".into());
        }
        _ => {}
    }
    sets
}

/// The harness's rows with their problem text as metadata.
const PROBLEMS: &str = "data={path = \"{data}\", metadata_key = \"q\"}";

/// [`agent`] of `ty` on the harness's model warm-started on its demonstrations and their data,
/// with turns long enough for a tool call; agentflow's modules and tool_orchestra's experts are
/// the scripted expert, and tool_orchestra searches the harness's corpus.
fn warm(ty: &str, extra: &str) -> Vec<String> {
    let dir = format!("{{warm_{ty}}}");
    let (label, metadata) = match ty {
        "search_r1" => ("reward_model.ground_truth.target", ""),
        "retool" => ("reward_model.ground_truth", ""),
        _ => (
            "reward_model.ground_truth",
            ", metadata_key = \"extra_info\"",
        ),
    };
    let limits = match ty {
        "agentflow" => "max_tokens_per_turn = 160, max_response_tokens = 640, max_turns = 2",
        "tool_orchestra" => {
            "max_tokens_per_turn = 48, max_response_tokens = 192, max_turns = 3, corpus = \"{corpus}\""
        }
        _ => "max_tokens_per_turn = 48, max_response_tokens = 192",
    };
    let extra = format!("{limits}, {extra}");
    let mut sets = agent(ty, extra.trim_end_matches(", "));
    sets.retain(|s| !s.starts_with("data=") && !s.starts_with("helpers."));
    if ty == "search_r1" {
        sets[0] = sets[0].replace("{corpus}", &format!("{dir}/data/corpus.jsonl"));
    }
    sets.push(format!("model.path=\"{dir}/sft/final-model\""));
    sets.push(format!(
        "data={{path = \"{dir}/data/train.jsonl\", input_key = \"prompt\", label_key = \"{label}\"{metadata}}}"
    ));
    let scripted = "url = \"{experts}\", model = \"scripted\", max_tokens = 32";
    if matches!(ty, "agentflow" | "tool_orchestra") {
        // 8 executions: several of each tool call (the runs take a second).
        sets.push("rollout.batch_size=4".into());
    }
    match ty {
        "agentflow" => {
            for h in ["executor", "verifier", "generator", "judge"] {
                sets.push(format!("helpers.{h}={{{scripted}}}"));
            }
        }
        "tool_orchestra" => {
            for (name, price) in [("small", 0.2), ("large", 3.0)] {
                sets.push(format!(
                    "helpers.{name}={{{scripted}, price_per_million_tokens = {price}}}"
                ));
            }
        }
        _ => {}
    }
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

/// `[agent]` of type terminal on the harness's model warm-started on endless_terminals'
/// demonstrations (it runs the tasks' commands), with its generated tasks as data.
fn terminal(extra: &str) -> Vec<String> {
    let dir = "{warm_endless_terminals}";
    let mut body =
        "type = \"terminal\", max_tokens_per_turn = 200, max_response_tokens = 600, max_turns = 2"
            .to_string();
    for pair in extra.split(", ").filter(|p| !p.is_empty()) {
        let key = pair.split(" = ").next().unwrap();
        body = body
            .split(", ")
            .filter(|p| !p.starts_with(&format!("{key} ")))
            .collect::<Vec<_>>()
            .join(", ");
        body.push_str(&format!(", {pair}"));
    }
    vec![
        format!("agent={{{body}}}"),
        format!("model.path=\"{dir}/sft/final-model\""),
        format!("data={{path = \"{dir}/data/train.jsonl\", input_key = \"prompt\", metadata_key = \"extra_info\"}}"),
        "reward={type = \"exact_match\"}".into(),
    ]
}

fn terminal_cases() -> Vec<Case> {
    use Obs::*;
    let one = |k: &str, v: &str, obs: Obs| {
        case(
            &[&format!("agent(terminal).{k}")],
            terminal(""),
            terminal(&format!("{k} = {v}")),
            obs,
        )
    };
    let mut c = limit_cases("terminal", terminal);
    c.extend([
        // A cut tool response is fewer appended tokens (every command here times out, so every
        // response is the long TIMEOUT note).
        case(
            &["agent(terminal).max_observation_tokens"],
            terminal("command_timeout_secs = 1e-3"),
            terminal("command_timeout_secs = 1e-3, max_observation_tokens = 2"),
            Turns,
        ),
        // Whether a fast command (chmod, ls) outlives 1 ms depends on the machine's load, so the
        // run shows the timeout it applies; the hostile suite and the episode tests stop real
        // commands at their timeout.
        one(
            "command_timeout_secs",
            "1e-3",
            Stderr("each stopped after 0.001 s"),
        ),
        one("file_tools", "true", Stderr("tools: bash, view, edit")),
        one("tool_concurrency", "3", Stderr("3 commands at once")),
    ]);
    c
}

/// `[agent]` of type tau_retail (`extra`: `key = value` pairs that replace the defaults) on the
/// harness's generated scenarios, with a policy that calls a tool every turn (one the store does
/// not have: each result is the same long error) and plays the customer too.
fn tau(extra: &str) -> Vec<String> {
    let keys =
        format!("max_tokens_per_turn = 16, max_response_tokens = 400, max_turns = 3, {extra}");
    let mut sets = agent("tau_retail", keys.trim_end_matches(", "));
    sets.extend([
        "model.path=\"{tool_model}\"".into(),
        "data={path = \"{tau_data}\", input_key = \"prompt\", metadata_key = \"extra_info\"}"
            .into(),
        "helpers.user={policy = true, max_tokens = 8}".into(),
        "reward={type = \"exact_match\"}".into(),
    ]);
    sets
}

/// The four limits every agent type with turns has, each set low against `build("")` (`build`
/// takes `key = value` pairs for the `[agent]` table).
fn limit_cases(ty: &str, build: fn(&str) -> Vec<String>) -> Vec<Case> {
    use Obs::*;
    let one = |k: &str, v: &str, obs: Obs| {
        case(
            &[&format!("agent({ty}).{k}")],
            build(""),
            build(&format!("{k} = {v}")),
            obs,
        )
    };
    vec![
        one(
            "max_tokens_per_turn",
            "2",
            Metric("rollout/response_len_max"),
        ),
        one(
            "max_response_tokens",
            "3",
            Metric("rollout/response_len_max"),
        ),
        one("deadline_secs", "1e-4", Responses),
        one("max_turns", "1", Metric("agent/turns")),
    ]
}

fn tau_cases() -> Vec<Case> {
    let mut c = limit_cases("tau_retail", tau);
    // The tool's error is cut: fewer appended tokens.
    c.push(case(
        &["agent(tau_retail).max_observation_tokens"],
        tau(""),
        tau("max_observation_tokens = 2"),
        Obs::Turns,
    ));
    c
}

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
            let turns = if ty == "agentflow" {
                "agent/steps"
            } else {
                "agent/turns"
            };
            c.push(one("max_turns", ", max_turns = 1", Metric(turns)));
        }
    }
    c.extend(terminal_cases());
    c.extend(tau_cases());
    let mut orchestra_two = agent("tool_orchestra", "");
    orchestra_two.push("helpers.other={policy = true, max_tokens = 4}".into());
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
        case(
            &["agent(agentflow).tool_concurrency"],
            agent("agentflow", ""),
            agent("agentflow", ", tool_concurrency = 3"),
            Stderr("3 programs at once"),
        ),
        // The expert list and the search tool are in the orchestrator's prompt.
        case(
            &["agent(tool_orchestra).experts"],
            orchestra_two.clone(),
            orchestra_two
                .iter()
                .map(|s| {
                    s.replace(
                        "type = \"tool_orchestra\"",
                        "type = \"tool_orchestra\", experts = [\"expert\"]",
                    )
                })
                .collect(),
            Turns,
        ),
        case(
            &["agent(tool_orchestra).tool_concurrency"],
            agent("tool_orchestra", ""),
            agent("tool_orchestra", ", tool_concurrency = 3"),
            Stderr("3 programs at once"),
        ),
    ]);
    // search_r1 and retool on models warm-started on their demonstrations: they search and
    // call the interpreter.
    let sr = |extra: &str| warm("search_r1", extra);
    let rt = |extra: &str| warm("retool", extra);
    // The format reward's terms need wrong answers of each shape: 8 prompts × 4 samples.
    let fmt = |f: &str| {
        let mut sets = sr(&format!("format_reward = {{{f}}}"));
        sets.extend([
            "rollout.batch_size=8".into(),
            "rollout.n_samples_per_prompt=4".into(),
        ]);
        sets
    };
    let unreachable = sr("")
        .into_iter()
        .map(|s| {
            s.replace(
                "corpus = \"{warm_search_r1}/data/corpus.jsonl\"",
                "retrieval_url = \"http://127.0.0.1:9/retrieve\"",
            )
        })
        .collect();
    let retrieved = |sets: Vec<String>| -> Vec<String> {
        sets.into_iter()
            .map(|s| {
                s.replace(
                    "corpus = \"{warm_search_r1}/data/corpus.jsonl\"",
                    "retrieval_url = \"{url}/retrieve\"",
                )
            })
            .collect()
    };
    // The questions whose gold answer a failed search's text holds (see the harness), 16 prompts
    // × 4 samples: the term needs a well-formed wrong answer after a search.
    let matched = |sets: Vec<String>| -> Vec<String> {
        let mut sets: Vec<String> = sets
            .into_iter()
            .filter(|s| !s.starts_with("data=") && !s.starts_with("rollout.batch_size="))
            .collect();
        sets.push("data={path = \"{search_matched}\", input_key = \"prompt\"}".into());
        sets.push("rollout.batch_size=16".into());
        sets
    };
    let mut observed = sr("");
    observed.push("algorithm.loss.observation_coef=0.05".into());
    c.extend([
        case(
            &["agent(search_r1).max_turns"],
            sr(""),
            sr("max_turns = 1"),
            Metric("agent/turns"),
        ),
        // Through a retrieval service that always returns `topk` documents.
        case(
            &["agent(search_r1).topk"],
            retrieved(sr("")),
            retrieved(sr("topk = 1")),
            Turns,
        ),
        case(
            &["agent(search_r1).max_observation_tokens"],
            sr(""),
            sr("max_observation_tokens = 4"),
            Turns,
        ),
        case(
            &["agent(search_r1).retrieval_url"],
            sr(""),
            unreachable,
            Turns,
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
            matched(fmt("")),
            matched(fmt("retrieval = 0.5")),
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
            Turns,
        ),
        case(
            &["agent(retool).tool_timeout_secs"],
            rt(""),
            rt("tool_timeout_secs = 1e-3"),
            Turns,
        ),
        case(
            &["agent(retool).tool_memory_mb"],
            rt(""),
            rt("tool_memory_mb = 1"),
            Turns,
        ),
    ]);
    // agentflow's planner (warm: it plans python_coder and base_generator steps) and
    // tool_orchestra's orchestrator (warm: it calls reason, search and answer) with the scripted
    // expert behind every call. A tool result, cut or failed, is in the next turn's prompt.
    let af = |extra: &str| warm("agentflow", extra);
    let to = |extra: &str| warm("tool_orchestra", extra);
    for (ty, make) in [
        ("agentflow", &af as &dyn Fn(&str) -> Vec<String>),
        ("tool_orchestra", &to),
    ] {
        for (key, value) in [
            ("max_observation_tokens", "3"),
            ("tool_timeout_secs", "1e-3"),
            ("tool_memory_mb", "1"),
        ] {
            c.push(case(
                &[&format!("agent({ty}).{key}")],
                make(""),
                make(&format!("{key} = {value}")),
                Turns,
            ));
        }
    }
    let other_corpus = |s: String| s.replace("{corpus}", "{warm_search_r1}/data/corpus.jsonl");
    let unreachable = |s: String| {
        s.replace(
            "corpus = \"{corpus}\"",
            "retrieval_url = \"http://127.0.0.1:9/retrieve\"",
        )
    };
    // The efficiency reward, correct − min(max_penalty, cost_weight·cost + latency/scale), moves
    // with the measured latency by about 1e-5 from run to run.
    let reward = MetricBeyond("reward/mean", 1e-3);
    c.extend([
        case(
            &["agent(tool_orchestra).corpus"],
            to(""),
            to("").into_iter().map(other_corpus).collect(),
            Turns,
        ),
        case(
            &["agent(tool_orchestra).retrieval_url"],
            to(""),
            to("").into_iter().map(unreachable).collect(),
            Turns,
        ),
        case(
            &["agent(tool_orchestra).topk"],
            to(""),
            to("topk = 1"),
            Turns,
        ),
        case(
            &["agent(tool_orchestra).cost_weight"],
            to(""),
            to("cost_weight = 1e4"),
            reward.clone(),
        ),
        case(
            &["agent(tool_orchestra).latency_scale_secs"],
            to(""),
            to("latency_scale_secs = 1e-9"),
            reward.clone(),
        ),
        case(
            &["agent(tool_orchestra).max_penalty"],
            to("latency_scale_secs = 1e-9"),
            to("latency_scale_secs = 1e-9, max_penalty = 0.1"),
            reward,
        ),
    ]);
    // [helpers.NAME], through agentflow's executor on the warm-started planner (the other modules
    // scripted): what the executor's step gave is in the next plan's prompt.
    let executor = |h: &str| {
        let mut s = af("");
        s.retain(|x| !x.starts_with("helpers.executor="));
        s.push(format!("helpers.executor={{{h}}}"));
        s
    };
    let scripted = "url = \"{experts}\", model = \"scripted\", max_tokens = 32";
    let engine = "policy = true, max_tokens = 16";
    let teacher = "url = \"{teacher}/v1\", max_tokens = 16";
    let helper = |k: &str, base: &str, h: &str, obs: Obs| {
        case(
            &[&format!("helpers.NAME.{k}")],
            executor(base),
            executor(&format!("{base}, {h}")),
            obs,
        )
    };
    let source = |k: &str, base: &str, h: &str| {
        case(
            &[&format!("helpers.NAME.{k}")],
            executor(base),
            executor(h),
            Turns,
        )
    };
    c.extend([
        // A scripted executor's code runs and its output is in the next plan's prompt; an
        // engine's (the tiny models write no code) leaves "no code was written" there.
        source("policy", scripted, engine),
        source("path", scripted, "path = \"{model2}\", max_tokens = 16"),
        source("url", engine, scripted),
        helper(
            "max_tokens",
            "policy = true",
            "max_tokens = 1",
            Metric("agent/helper/executor/tokens"),
        ),
        // The scripted expert prints the temperature it was asked with.
        helper("temperature", scripted, "temperature = 1.0", Turns),
        helper(
            "timeout_secs",
            engine,
            "timeout_secs = 1e-9",
            Metric("agent/failed_frac"),
        ),
        helper(
            "price_per_million_tokens",
            scripted,
            "price_per_million_tokens = 1e5",
            Metric("agent/helper/executor/cost"),
        ),
        // Without it the helper asks the server's /models, which the scripted expert lacks.
        case(
            &["helpers.NAME.model"],
            executor("url = \"{experts}\", max_tokens = 32"),
            executor(scripted),
            Rescues("which model it serves"),
        ),
        helper(
            "api_key_env",
            teacher,
            "api_key_env = \"OOZE_TEST_NO_SUCH_KEY\"",
            Fails("OOZE_TEST_NO_SUCH_KEY"),
        ),
        helper(
            "slots",
            "path = \"{model2}\", max_tokens = 16",
            "slots = 1",
            Stderr("1 sequences"),
        ),
    ]);
    // An expert's description is in tool_orchestra's prompt.
    let orchestra = agent("tool_orchestra", "");
    let described: Vec<String> = orchestra
        .iter()
        .map(|s| {
            s.replace(
                "helpers.expert={",
                "helpers.expert={description = \"a careful model\", ",
            )
        })
        .collect();
    c.push(case(
        &["helpers.NAME.description"],
        orchestra,
        described,
        Turns,
    ));
    c.extend(command_cases());
    c
}

/// `type = "command"`: the harness's program (`command_agent.py`) chats with the policy until a
/// call is refused (4 calls by default: `max_turns`) and reports in its result line what it saw:
/// the most programs of the run at once, whether its working directory is the harness's, whether
/// it could map 256 MiB, and `$AGENT_REWARD` as its reward. `env` is a table: the audit sees its
/// variables as `env.NAME`.
fn command_cases() -> Vec<Case> {
    use Obs::*;
    let one = |k: &str, extra: &str, obs: Obs| {
        case(
            &[&format!("agent(command).{k}")],
            agent("command", ""),
            agent("command", extra),
            obs,
        )
    };
    // Its argument: one call, then the result.
    let one_call = agent("command", "")
        .into_iter()
        .map(|s| s.replace("\"{command_agent}\"]", "\"{command_agent}\", \"1\"]"))
        .collect();
    vec![
        case(
            &["agent(command).command"],
            agent("command", ""),
            one_call,
            Metric("agent/gateway/calls"),
        ),
        one("cwd", "cwd = \"{command_cwd}\"", Metric("agent/in_cwd")),
        one(
            "env.NAME",
            "env = {AGENT_REWARD = \"2\"}",
            Metric("reward/mean"),
        ),
        one(
            "concurrency",
            "concurrency = 1",
            Metric("agent/peak_programs"),
        ),
        // Its address space holds the interpreter, not 256 MiB more.
        one("memory_mb", "memory_mb = 200", Metric("agent/reserved_mb")),
        // The gateway refuses the third call…
        one("max_turns", "max_turns = 2", Metric("agent/gateway/calls")),
        // …and, after a first turn of 3 tokens, the second.
        one(
            "max_response_tokens",
            "max_response_tokens = 3",
            Metric("agent/gateway/calls"),
        ),
        one(
            "max_tokens_per_turn",
            "max_tokens_per_turn = 2",
            Metric("rollout/response_len_max"),
        ),
        // Its own network namespace (loopback only, the gateway relayed in) by default; the
        // host's interfaces with "host".
        one("network", "network = \"host\"", Metric("agent/interfaces")),
        // The program is killed as it starts: every execution fails (reward 0, not trained).
        one(
            "deadline_secs",
            "deadline_secs = 1e-4",
            Metric("agent/failed_frac"),
        ),
    ]
}
