//! The table: for every key the recipe parser accepts, a non-default value and what it changes.
//! Keys of a tagged section are written `reward(TYPE).key` / `agent(TYPE).key`; the helpers'
//! table `helpers.NAME.key`; eval sets `eval.datasets[].key`.

/// What a case's run shows against its base run.
#[derive(Debug, Clone)]
pub enum Obs {
    /// The metric's series over metrics.jsonl differs (value or presence).
    Metric(&'static str),
    /// The saved samples (response ids, log-probs, rewards) differ.
    Responses,
    /// The saved prompts (text, ids, label, metadata) or their order differ.
    Prompts,
    /// The final weights differ.
    Weights,
    /// This run-directory entry is present in one run and absent in the other.
    Entry(&'static str),
    /// The case's stderr has this text and the base's has not.
    Stderr(&'static str),
    /// The case fails with this text; the base succeeds.
    Fails(&'static str),
    /// The base fails with this text; the case succeeds.
    Rescues(&'static str),
    /// The recipe is refused when parsed, naming this (no run): keys that cannot act here.
    Refused(&'static str),
    /// Replays the base run's rollouts (`{base_run}`): the base's weights, not what its own
    /// sampling settings would give.
    Replays,
    /// The run directory is where the key says.
    RunDir(&'static str),
    /// Resource knobs: the numbers equal the base's (asserted) and the effect is the text's,
    /// which a CPU run cannot show.
    Resource(&'static str),
    /// No run shows it on the CPU with a random policy (the reason): listed, not asserted.
    Untested(&'static str),
}

pub struct Case {
    pub keys: Vec<String>,
    pub base: Vec<String>,
    pub sets: Vec<String>,
    pub obs: Obs,
}

fn strings(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|s| s.to_string()).collect()
}

fn case(keys: &[&str], base: &[&str], sets: &[&str], obs: Obs) -> Case {
    Case {
        keys: strings(keys),
        base: strings(base),
        sets: strings(sets),
        obs,
    }
}

/// `algorithm.loss.observation_coef` is not in the table: nothing sets observation masks yet
/// (wired by the sample refactor).
pub const EXCLUDED: &[&str] = &["algorithm.loss.observation_coef"];

pub fn cases() -> Vec<Case> {
    use Obs::*;
    let data_path = "data={path = \"{data}\"}";
    let two_steps: &[&str] = &[
        "rollout.n_samples_per_prompt=4",
        "trainer.global_batch_size=4",
        "trainer.lr=0.05",
    ];
    let ppo = "algorithm.advantage.estimator=\"ppo\"";
    let rpp = "algorithm.advantage.estimator=\"reinforce_plus_plus\"";
    let kl_loss = "algorithm.loss.kl_loss_coef=0.5";
    let reference = "model.reference=\"{model2}\"";
    let dynamic = "rollout.dynamic_sampling=true";
    let eval = |extra: &str| {
        format!("eval.datasets=[{{name = \"held\", task = \"addition\", task_size = 16{extra}}}]")
    };
    let mut c = vec![
        // [model]
        case(
            &["model.path"],
            &[],
            &["model.path=\"{model2}\""],
            Responses,
        ),
        // GPU only on this machine: asking for one names the key (gpu.rs runs it on a GPU).
        case(
            &["model.device"],
            &[],
            &["model.device=\"cuda\""],
            Fails("model.device"),
        ),
        case(&["model.dtype"], &[], &["model.dtype=\"bf16\""], Responses),
        case(
            &["model.reference"],
            &[kl_loss],
            &[kl_loss, reference],
            Metric("train/kl"),
        ),
        // [data]
        case(&["data.task"], &[], &["data.task=\"repeat\""], Prompts),
        case(&["data.task_size"], &[], &["data.task_size=9"], Prompts),
        case(&["data.task_seed"], &[], &["data.task_seed=5"], Prompts),
        case(&["data.path"], &[], &[data_path], Prompts),
        case(
            &["data.input_key"],
            &[data_path],
            &["data={path = \"{data}\", input_key = \"q\"}"],
            Prompts,
        ),
        case(
            &["data.label_key"],
            &[data_path],
            &["data={path = \"{data}\", label_key = \"answer\"}"],
            Prompts,
        ),
        case(
            &["data.metadata_key"],
            &[data_path],
            &["data={path = \"{data}\", metadata_key = \"meta\"}"],
            Metric("reward/mean"),
        ),
        case(
            &["data.tools_key"],
            &[data_path],
            &["data={path = \"{data}\", tools_key = \"tools\"}"],
            Prompts,
        ),
        case(
            &["data.skip_bad_rows"],
            &["data={path = \"{bad_data}\"}"],
            &["data={path = \"{bad_data}\", skip_bad_rows = true}"],
            Rescues("bad.jsonl:9"),
        ),
        case(
            &["data.apply_chat_template"],
            &[],
            &["data.apply_chat_template=false"],
            Prompts,
        ),
        case(
            &["data.system_prompt"],
            &[],
            &["data.system_prompt=\"Be brief.\""],
            Prompts,
        ),
        case(
            &["data.max_prompt_tokens"],
            &[data_path],
            &[data_path, "data.max_prompt_tokens=60"],
            Prompts,
        ),
        case(&["data.shuffle"], &[], &["data.shuffle=false"], Prompts),
        case(&["data.seed"], &[], &["data.seed=7"], Prompts),
        // [rollout]
        case(
            &["rollout.num_rollouts"],
            &[],
            &["rollout.num_rollouts=2"],
            Metric("step"),
        ),
        case(
            &["rollout.batch_size"],
            &[],
            &["rollout.batch_size=3"],
            Metric("rollout/samples"),
        ),
        case(
            &["rollout.n_samples_per_prompt"],
            &[],
            &["rollout.n_samples_per_prompt=3"],
            Metric("rollout/samples"),
        ),
        case(
            &["rollout.max_new_tokens"],
            &[],
            &["rollout.max_new_tokens=3"],
            Metric("rollout/response_len_max"),
        ),
        case(
            &["rollout.temperature"],
            &[],
            &["rollout.temperature=0.3"],
            Responses,
        ),
        case(&["rollout.top_p"], &[], &["rollout.top_p=0.05"], Responses),
        case(&["rollout.top_k"], &[], &["rollout.top_k=2"], Responses),
        case(
            &["rollout.stop"],
            &[],
            &["rollout.stop=[\"a\", \"e\", \"i\", \"o\", \"n\", \"t\", \"s\", \" \"]"],
            Responses,
        ),
        case(
            &["rollout.concurrency"],
            &[],
            &["rollout.concurrency=1"],
            Stderr("engine: 1 sequences"),
        ),
        case(
            &["rollout.max_running"],
            &[],
            &["rollout.max_running=3"],
            Stderr("engine: 3 sequences"),
        ),
        // GPU only (the share of free GPU memory the KV cache takes): checked when parsed.
        case(
            &["rollout.mem_fraction"],
            &[],
            &["rollout.mem_fraction=0"],
            Refused("rollout.mem_fraction"),
        ),
        case(&["rollout.seed"], &[], &["rollout.seed=7"], Responses),
        case(
            &["rollout.dynamic_sampling"],
            &["reward={type = \"regex\", pattern = \"^$\"}"],
            &[
                "reward={type = \"regex\", pattern = \"^$\"}",
                dynamic,
                "rollout.max_rounds=1",
            ],
            Metric("rollout/dropped_zero_std"),
        ),
        case(
            &["rollout.min_reward_std"],
            &[dynamic, "rollout.max_rounds=1"],
            &[dynamic, "rollout.max_rounds=1", "rollout.min_reward_std=10"],
            Metric("rollout/dropped_low_std"),
        ),
        case(
            &["rollout.over_sampling_batch_size"],
            &[dynamic, "rollout.min_reward_std=10", "rollout.max_rounds=2"],
            &[
                dynamic,
                "rollout.min_reward_std=10",
                "rollout.max_rounds=2",
                "rollout.over_sampling_batch_size=3",
            ],
            Metric("rollout/generated_groups"),
        ),
        case(
            &["rollout.max_rounds"],
            &[dynamic, "rollout.min_reward_std=10", "rollout.max_rounds=2"],
            &[dynamic, "rollout.min_reward_std=10", "rollout.max_rounds=3"],
            Metric("rollout/rounds"),
        ),
        case(
            &["rollout.drop_truncated_groups"],
            &[],
            &["rollout.drop_truncated_groups=true"],
            Metric("rollout/dropped_truncated"),
        ),
        case(
            &["rollout.mask_truncated"],
            &[],
            &["rollout.mask_truncated=true"],
            Responses,
        ),
        // [reward]
        case(
            &["reward.type"],
            &[],
            &["reward={type = \"task\"}"],
            Metric("reward/mean"),
        ),
        case(
            &["reward(math).answer_pattern"],
            &["reward={type = \"math\"}"],
            &["reward={type = \"math\", answer_pattern = \"(\"}"],
            Refused("reward.answer_pattern"),
        ),
        case(
            &["reward(regex).pattern"],
            &["reward={type = \"regex\", pattern = \"^$\"}"],
            &["reward={type = \"regex\", pattern = \".\"}"],
            Metric("reward/mean"),
        ),
        case(
            &["reward(function).name"],
            &["reward={type = \"function\", name = \"addition\"}"],
            &["reward={type = \"function\", name = \"nope\"}"],
            Fails("reward.name: no reward function `nope`"),
        ),
        // The command line registers no group function: the type is refused before a rollout.
        case(
            &["reward(group_function).name"],
            &[],
            &["reward={type = \"group_function\", name = \"best\"}"],
            Fails("reward.name: no group reward function `best`"),
        ),
        case(
            &["reward(remote).url"],
            &[],
            &["reward.url=\"{url}/double\""],
            Metric("reward/mean"),
        ),
        case(
            &["reward(remote).timeout_secs"],
            &["reward.url=\"{url}/slow\""],
            &[
                "reward.url=\"{url}/slow\"",
                "reward.timeout_secs=0.2",
                "reward.max_retries=0",
            ],
            Fails("reward model"),
        ),
        case(
            &["reward(remote).max_retries"],
            &["reward.url=\"{url}/flaky\""],
            &["reward.url=\"{url}/flaky\"", "reward.max_retries=0"],
            Fails("failed after 1 attempt"),
        ),
        // [algorithm.advantage]
        case(
            &["algorithm.advantage.estimator"],
            &[],
            &["algorithm.advantage.estimator=\"rloo\""],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.std_normalization"],
            &[],
            &["algorithm.advantage.std_normalization=false"],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.gamma"],
            &[rpp],
            &[rpp, "algorithm.advantage.gamma=0.5"],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.lambda"],
            &[ppo],
            &[ppo, "algorithm.advantage.lambda=0.5"],
            Metric("train/grad_norm"),
        ),
        // The reference is the policy's start: the KL acts from the second rollout on.
        case(
            &["algorithm.advantage.kl_coef"],
            &[rpp, "rollout.num_rollouts=2", "trainer.lr=0.05"],
            &[
                rpp,
                "rollout.num_rollouts=2",
                "trainer.lr=0.05",
                "algorithm.advantage.kl_coef=0.5",
            ],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.kl_estimator"],
            &[rpp, reference, "algorithm.advantage.kl_coef=0.5"],
            &[
                rpp,
                reference,
                "algorithm.advantage.kl_coef=0.5",
                "algorithm.advantage.kl_estimator=\"k1\"",
            ],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.normalize_advantages"],
            &[],
            &["algorithm.advantage.normalize_advantages=true"],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.opd_coef", "teacher.path"],
            &[],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.path=\"{model2}\"",
            ],
            Metric("train/teacher_logp_gap"),
        ),
        case(
            &["algorithm.advantage.clip"],
            &[],
            &["algorithm.advantage.clip=0.01"],
            Metric("train/grad_norm"),
        ),
        // [algorithm.loss]
        case(
            &["algorithm.loss.policy"],
            &[],
            &["algorithm.loss.policy=\"cispo\""],
            Metric("train/policy_loss"),
        ),
        case(
            &["algorithm.loss.eps_low"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "algorithm.loss.eps_low=0.001",
            ],
            Metric("train/clipfrac"),
        ),
        case(
            &["algorithm.loss.eps_high"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "algorithm.loss.eps_high=0.001",
            ],
            Metric("train/clipfrac"),
        ),
        case(
            &["algorithm.loss.dual_clip"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "algorithm.loss.dual_clip=1.0001",
            ],
            Metric("train/loss"),
        ),
        case(
            &["algorithm.loss.importance.mode"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\", low = 1.5}"],
            &["algorithm.loss.importance={level = \"token\", mode = \"mask\", low = 1.5}"],
            Metric("train/importance_weight"),
        ),
        // bf16: the engine's and the trainer's log-probs differ, so token and sequence weights do.
        case(
            &["algorithm.loss.importance.level"],
            &[
                "model.dtype=\"bf16\"",
                "algorithm.loss.importance={level = \"token\", mode = \"truncate\", high = 1.0}",
            ],
            &[
                "model.dtype=\"bf16\"",
                "algorithm.loss.importance={level = \"sequence\", mode = \"truncate\", high = 1.0}",
            ],
            Metric("train/importance_weight"),
        ),
        case(
            &["algorithm.loss.importance.low"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\"}"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\", low = 1.5}"],
            Metric("train/importance_weight"),
        ),
        case(
            &["algorithm.loss.importance.high"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\"}"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\", high = 0.5}"],
            Metric("train/importance_weight"),
        ),
        case(
            &["algorithm.loss.kl_loss_coef"],
            &[],
            &[kl_loss],
            Metric("train/kl"),
        ),
        case(
            &["algorithm.loss.kl_estimator"],
            &[kl_loss, reference],
            &[kl_loss, reference, "algorithm.loss.kl_estimator=\"k1\""],
            Metric("train/kl"),
        ),
        case(
            &["algorithm.loss.kl_unbiased"],
            &[kl_loss, reference, two_steps[0], two_steps[1], two_steps[2]],
            &[
                kl_loss,
                reference,
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "algorithm.loss.kl_unbiased=true",
            ],
            Metric("train/loss"),
        ),
        case(
            &["algorithm.loss.entropy_coef"],
            &[],
            &["algorithm.loss.entropy_coef=0.1"],
            Metric("train/loss"),
        ),
        case(
            &["algorithm.loss.value_coef"],
            &[ppo],
            &[ppo, "algorithm.loss.value_coef=0.5"],
            Metric("train/loss"),
        ),
        // The critic's clip is critic.value_clip; this one is refused, naming that.
        case(
            &["algorithm.loss.value_clip"],
            &[],
            &["algorithm.loss.value_clip=0.5"],
            Refused("critic.value_clip"),
        ),
        case(
            &["algorithm.aggregation"],
            &[],
            &["algorithm.aggregation=\"seq_mean_token_sum\""],
            Metric("train/grad_norm"),
        ),
        // [trainer]
        case(
            &["trainer.mode"],
            &[],
            &["trainer.mode=\"rollout_only\""],
            Metric("train/loss"),
        ),
        case(
            &["trainer.replay_from"],
            &[],
            &[
                "trainer.mode=\"replay\"",
                "trainer.replay_from=\"{base_run}\"",
                "rollout.seed=99",
            ],
            Replays,
        ),
        case(
            &["trainer.global_batch_size"],
            &[],
            &["trainer.global_batch_size=2"],
            Metric("train/steps"),
        ),
        case(&["trainer.lr"], &[], &["trainer.lr=0.05"], Weights),
        case(
            &["trainer.warmup_steps"],
            &[],
            &["trainer.warmup_steps=5"],
            Metric("train/lr"),
        ),
        case(
            &["trainer.decay"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.decay=\"linear\"",
            ],
            Metric("train/lr"),
        ),
        case(
            &["trainer.min_lr_ratio"],
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.decay=\"linear\"",
            ],
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.decay=\"linear\"",
                "trainer.min_lr_ratio=0.9",
            ],
            Metric("train/lr"),
        ),
        case(
            &["trainer.optimizer.beta1"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.optimizer.beta1=0.1",
            ],
            Weights,
        ),
        case(
            &["trainer.optimizer.beta2"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.optimizer.beta2=0.5",
            ],
            Weights,
        ),
        case(
            &["trainer.optimizer.eps"],
            &[],
            &["trainer.optimizer.eps=1.0"],
            Weights,
        ),
        case(
            &["trainer.optimizer.weight_decay"],
            &[],
            &["trainer.optimizer.weight_decay=0.5"],
            Weights,
        ),
        case(
            &["trainer.optimizer.clip_grad"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.optimizer.clip_grad=1e-6",
            ],
            Weights,
        ),
        case(
            &["trainer.max_tokens_per_micro_batch"],
            &[],
            &["trainer.max_tokens_per_micro_batch=8"],
            Resource("peak activation memory (one sample per micro-batch)"),
        ),
        case(
            &["trainer.recompute_activations"],
            &[],
            &["trainer.recompute_activations=true"],
            Resource("activation memory (blocks recomputed in the backward pass)"),
        ),
        case(
            &["trainer.save_interval"],
            &["rollout.num_rollouts=2"],
            &["rollout.num_rollouts=2", "trainer.save_interval=1"],
            Entry("checkpoint-000001"),
        ),
        // [critic] (estimator = "ppo")
        case(
            &["critic.path"],
            &[ppo, two_steps[0], two_steps[1], two_steps[2]],
            &[
                ppo,
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "critic.path=\"{model2}\"",
            ],
            Metric("train/value_loss"),
        ),
        case(
            &["critic.lr"],
            &[ppo, two_steps[0], two_steps[1], two_steps[2]],
            &[
                ppo,
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "critic.lr=0.5",
            ],
            Metric("train/value_loss"),
        ),
        case(
            &["critic.value_clip"],
            &[
                ppo,
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "critic.lr=0.5",
            ],
            &[
                ppo,
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "critic.lr=0.5",
                "critic.value_clip=1e-4",
            ],
            Metric("train/value_loss"),
        ),
        case(
            &["critic.warmup_steps"],
            &[ppo],
            &[ppo, "critic.warmup_steps=1"],
            Metric("train/policy_frozen_steps"),
        ),
        // [teacher] (algorithm.advantage.opd_coef); {teacher} serves the policy's own weights.
        case(
            &["teacher.url"],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.path=\"{model2}\"",
            ],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher={url = \"{teacher}\"}",
            ],
            Metric("train/teacher_logp_gap"),
        ),
        case(
            &["teacher.timeout_secs"],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.url=\"{teacher}\"",
            ],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.url=\"{teacher}\"",
                "teacher.timeout_secs=1e-6",
            ],
            Fails("teacher"),
        ),
        case(
            &["teacher.concurrency"],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.url=\"{teacher}\"",
            ],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.url=\"{teacher}\"",
                "teacher.concurrency=1",
            ],
            Resource("teacher requests in flight"),
        ),
        // [eval]
        case(
            &["eval.interval"],
            &["rollout.num_rollouts=2", &eval("")],
            &["rollout.num_rollouts=2", &eval(""), "eval.interval=1"],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.at_start"],
            &[&eval("")],
            &[&eval(""), "eval.at_start=false"],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].name"],
            &[&eval("")],
            &[&eval("").replace("held", "other")],
            Metric("eval/other/pass@1"),
        ),
        case(
            &["eval.datasets[].task"],
            &[&eval("")],
            &[&eval("").replace("\"addition\"", "\"repeat\"")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].task_size"],
            &[&eval("")],
            &[&eval("").replace("16", "5")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].task_seed"],
            &[&eval("")],
            &[&eval(", task_seed = 3")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].path"],
            &[&eval("")],
            &["eval.datasets=[{name = \"held\", path = \"{data}\"}]"],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].n_samples"],
            &[&eval("")],
            &[&eval(", n_samples = 3")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].temperature"],
            &[&eval("")],
            &[&eval(", temperature = 0.3")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].top_p"],
            &[&eval("")],
            &[&eval(", top_p = 0.05")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].max_new_tokens"],
            &[&eval("")],
            &[&eval(", max_new_tokens = 2")],
            Metric("eval/held/response_len"),
        ),
        case(
            &["eval.datasets[].pass_k"],
            &[&eval(", n_samples = 2")],
            &[&eval(", n_samples = 2, pass_k = [2]")],
            Metric("eval/held/pass@2"),
        ),
        // [logging]
        case(
            &["logging.run_dir"],
            &[],
            &["logging.run_dir=\"{dir}/elsewhere\""],
            RunDir("{dir}/elsewhere"),
        ),
        case(
            &["logging.tensorboard"],
            &[],
            &["logging.tensorboard=true"],
            Entry("tensorboard"),
        ),
        case(
            &["logging.save_rollouts"],
            &[],
            &["logging.save_rollouts=false"],
            Entry("rollouts"),
        ),
        case(
            &["logging.report"],
            &[],
            &["logging.report=true"],
            Entry("report.html"),
        ),
        case(
            &["logging.progress"],
            &[],
            &["logging.progress=true"],
            Stderr("1/1"),
        ),
    ];
    c.extend(super::agent_cases::cases());
    for case in &mut c {
        if let Some((_, why)) = NOT_SHOWN
            .iter()
            .find(|(k, _)| case.keys.iter().any(|x| x == k))
        {
            case.obs = Untested(why);
        }
    }
    c
}

const RANDOM_FAILS: &str =
    "every execution of this agent fails with a random policy (agent/failed_frac = 1)";
const ONE_TURN: &str = "a random policy ends every execution after one turn";

/// Rows whose run shows no difference yet (the table keeps the attempted observable): the gaps.
const NOT_SHOWN: &[(&str, &str)] = &[
    (
        "algorithm.loss.eps_high",
        "the tiny run clips on the low side only",
    ),
    (
        "algorithm.loss.dual_clip",
        "no ratio beyond the dual clip in the tiny run",
    ),
    (
        "critic.value_clip",
        "value loss equal at 1e-4 in the tiny run",
    ),
    (
        "agent(search_r1).deadline_secs",
        "executions finish before the deadline",
    ),
    ("agent(search_r1).max_turns", ONE_TURN),
    (
        "agent(retool).deadline_secs",
        "executions finish before the deadline",
    ),
    ("agent(retool).max_turns", ONE_TURN),
    (
        "agent(memagent).deadline_secs",
        "executions finish before the deadline",
    ),
    (
        "agent(memagent).max_turns",
        "memagent's turns are its chunks: max_turns is not read (inert)",
    ),
    (
        "agent(memagent).chunk_tokens",
        "agent/turns is not reported by memagent",
    ),
    (
        "agent(multi_agent).max_turns",
        "multi_agent does not read max_turns (inert)",
    ),
    ("agent(multi_agent).max_tokens_per_turn", RANDOM_FAILS),
    ("agent(multi_agent).max_response_tokens", RANDOM_FAILS),
    ("agent(multi_agent).deadline_secs", RANDOM_FAILS),
    ("agent(multi_agent).solvers", RANDOM_FAILS),
    ("agent(agentflow).max_tokens_per_turn", RANDOM_FAILS),
    ("agent(agentflow).max_response_tokens", RANDOM_FAILS),
    ("agent(agentflow).deadline_secs", RANDOM_FAILS),
    ("agent(agentflow).max_turns", RANDOM_FAILS),
    ("agent(tool_orchestra).max_tokens_per_turn", RANDOM_FAILS),
    ("agent(tool_orchestra).max_response_tokens", RANDOM_FAILS),
    ("agent(tool_orchestra).deadline_secs", RANDOM_FAILS),
    ("agent(tool_orchestra).max_turns", RANDOM_FAILS),
    ("agent(tool_orchestra).latency_scale_secs", RANDOM_FAILS),
    ("agent(tool_orchestra).max_penalty", RANDOM_FAILS),
    ("helpers.NAME.policy", RANDOM_FAILS),
    ("helpers.NAME.path", RANDOM_FAILS),
    ("helpers.NAME.url", RANDOM_FAILS),
    ("helpers.NAME.max_tokens", RANDOM_FAILS),
    ("helpers.NAME.temperature", RANDOM_FAILS),
    ("helpers.NAME.timeout_secs", RANDOM_FAILS),
    ("helpers.NAME.price_per_million_tokens", RANDOM_FAILS),
    ("helpers.NAME.model", RANDOM_FAILS),
];
