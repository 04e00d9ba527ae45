//! Rows of `[model]`, `[data]`, `[rollout]` and `[reward]`.

use super::{case, Case, Obs};
use super::{KL_LOSS as kl_loss, REFERENCE as reference};

pub fn cases() -> Vec<Case> {
    use Obs::*;
    let data_path = "data={path = \"{data}\"}";
    let dynamic = "rollout.dynamic_sampling=true";
    vec![
        // [model]
        case(
            &["model.path"],
            &[],
            &["model.path=\"{model2}\""],
            Responses,
        ),
        // GPU only on this machine: asking for one names the key (tests/gpu/ runs it on a GPU).
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
        // GPU only (ooze's bf16 kernels; tests/gpu/ checks the bitwise log-probs): a CPU
        // recipe is refused when parsed.
        case(
            &["rollout.deterministic"],
            &[],
            &["rollout.deterministic=true", "model.device=\"cpu\""],
            Refused("rollout.deterministic needs a GPU in bf16"),
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
        // External engines: tests/engines.rs runs a whole RL run on `ooze serve` engines; here,
        // an engine that is not there is named.
        case(
            &["rollout.engines"],
            &[],
            &["rollout.engines=[\"http://127.0.0.1:9\"]"],
            Fails("rollout.engines: no engine answers /health: http://127.0.0.1:9"),
        ),
        case(
            &["rollout.engines_file"],
            &[],
            &["rollout.engines_file=\"{dir}/no-engines.txt\""],
            Fails("no-engines.txt: cannot read the engines file"),
        ),
        // The run's own engines (tests/engines.rs runs them beside two trainer ranks).
        case(
            &["rollout.gpus"],
            &[],
            &["rollout.gpus=1"],
            Entry("engines"),
        ),
        case(
            &["rollout.weight_sync"],
            &["rollout.gpus=1"],
            &["rollout.gpus=1", "rollout.weight_sync=\"disk\""],
            Entry("weights"),
        ),
        // tests/engines.rs runs a whole RL run over vLLM's API on `ooze serve` engines.
        case(
            &["rollout.engine_api"],
            &[],
            &["rollout.engine_api=\"vllm\""],
            Refused("rollout.engine_api applies to rollout.engines"),
        ),
        case(
            &["rollout.trainer_address"],
            &[],
            &["rollout.trainer_address=\"10.0.0.1\""],
            Refused("rollout.trainer_address applies to engines outside the trainer"),
        ),
        // Asynchronous rollouts (tests/asynchronous.rs runs them under an agent with tool
        // delays, and a killed run resumed): the groups a step finds started are the bound's.
        case(
            &["rollout.mode"],
            &[],
            &["rollout.mode=\"async\""],
            Metric("async/started_groups"),
        ),
        case(
            &["rollout.max_staleness"],
            &["rollout.mode=\"async\""],
            &["rollout.mode=\"async\"", "rollout.max_staleness=0"],
            Metric("async/started_groups"),
        ),
        case(
            &["rollout.over_provision"],
            &["rollout.mode=\"async\""],
            &["rollout.mode=\"async\"", "rollout.over_provision=3"],
            Metric("async/started_groups"),
        ),
        // Its effect needs a run long enough to go stale (tests/asynchronous.rs masks and
        // regenerates them).
        case(
            &["rollout.stale"],
            &[],
            &["rollout.stale=\"mask\""],
            Refused("rollout.stale applies to rollout.mode = \"async\""),
        ),
        case(
            &["rollout.weight_update_timeout_secs"],
            &["rollout.gpus=1"],
            &["rollout.gpus=1", "rollout.weight_update_timeout_secs=1e-6"],
            Fails("did not finish within 0 s (rollout.weight_update_timeout_secs)"),
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
            &["reward(python).path"],
            &["reward={type = \"python\", path = \"{rewards}:quarter\"}"],
            &["reward={type = \"python\", path = \"{rewards}:by_length\"}"],
            Metric("reward/mean"),
        ),
        case(
            &["reward(python).group"],
            &["reward={type = \"python\", path = \"{rewards}:either\"}"],
            &["reward={type = \"python\", path = \"{rewards}:either\", group = true}"],
            Metric("reward/mean"),
        ),
        // One worker counts its calls 1 to 4 (mean 2.5); more workers share the calls.
        case(
            &["reward(python).workers"],
            &["reward={type = \"python\", path = \"{rewards}:calls_in_this_worker\", workers = 1}"],
            &["reward={type = \"python\", path = \"{rewards}:calls_in_this_worker\", workers = 4}"],
            Metric("reward/mean"),
        ),
        case(
            &["reward(python).timeout_secs"],
            &["reward={type = \"python\", path = \"{rewards}:calls_in_this_worker\"}"],
            &["reward={type = \"python\", path = \"{rewards}:calls_in_this_worker\", timeout_secs = 0.1}"],
            Fails("no answer within 0.1 s (reward.timeout_secs)"),
        ),
        case(
            &["reward(python).python"],
            &["reward={type = \"python\", path = \"{rewards}:wrapped\"}"],
            &["reward={type = \"python\", path = \"{rewards}:wrapped\", python = \"{py}\"}"],
            Metric("reward/mean"),
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
    ]
}
