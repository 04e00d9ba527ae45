//! 256 agent executions at once on the CPU, each calling the sandbox (some tools loop forever, some
//! never return, some flood their output), through the rollout manager: every execution finishes,
//! with its tool's observation in its tokens, and none is stuck. The sandbox runs its default
//! number of programs at once (twice the CPUs, at least 4); the rest queue, so even on 2 loaded
//! cores `print(6 * 7)` gets the CPU it needs within its 2 s.

use ooze_agents::sandbox::{Sandbox, SandboxLimits};
use ooze_engine::{start, EngineConfig, SamplingParams};
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family, RenderOptions, Tokenizer};
use ooze_rollout::agent::{Agent, AgentContext, AgentError, AgentFuture, AgentLimits, AgentOutput};
use ooze_rollout::manager::{generate_groups, AgentRollout, RolloutSettings};
use ooze_rollout::prompts::PromptItem;
use ooze_rollout::scorer::Scorer;
use ooze_rollout::Reward;
use ooze_torch::tch::{Device, Kind};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Generates, runs a tool program chosen by the prompt, appends its output as a tool message,
/// generates again.
struct ToolAgent {
    sandbox: Sandbox,
}

const PROGRAMS: &[&str] = &[
    "print(6 * 7)",
    "while True:\n    pass",
    "import time\ntime.sleep(3600)",
    "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
];

impl Agent for ToolAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let mut conv = ctx.start(
                vec![json!({"role": "user", "content": prompt.text.clone()})],
                None,
            )?;
            ctx.generate(&mut conv, &["</tool_call>"]).await?;
            let program = PROGRAMS[prompt.source_line % PROGRAMS.len()];
            let run = self
                .sandbox
                .run_python(program)
                .await
                .map_err(|e| AgentError::Agent(e.to_string()))?;
            let observation = ctx.truncate(&run.observation(), 64)?;
            ctx.append_message(&mut conv, json!({"role": "tool", "content": observation}))?;
            ctx.generate(&mut conv, &[]).await?;
            Ok(AgentOutput {
                samples: vec![conv.sample],
                reward: Some(run.success() as u8 as f64),
                final_response: None,
                metrics: [("tool_calls".to_string(), 1.0)].into(),
            })
        })
    }
}

#[test]
fn two_hundred_fifty_six_tool_trajectories_all_finish() {
    let dir = tempfile::tempdir().unwrap();
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(3, 30_000),
        &InitOptions::new(Family::Qwen2, Size::Tiny),
    )
    .unwrap();
    let tokenizer = Arc::new(Tokenizer::load(dir.path()).unwrap());
    let eos = vec![tokenizer.token_to_id("<|im_end|>").unwrap()];
    let decoder = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let engine = start(
        decoder,
        Some(tokenizer.clone()),
        EngineConfig::new(64, 256, eos),
    );
    let sandbox = Sandbox::new(SandboxLimits {
        wall: Duration::from_secs(2),
        memory_bytes: 256 << 20,
        output_bytes: 4096,
        ..Default::default()
    })
    .unwrap();
    let template = tokenizer.chat_template(false).unwrap();
    let prompts: Vec<(u64, PromptItem)> = (0..32)
        .map(|i| {
            let text = format!("Task {i}: run the tool.");
            let rendered = template
                .render(
                    &[json!({"role": "user", "content": text})],
                    &RenderOptions {
                        add_generation_prompt: true,
                        tools: None,
                        kwargs: Default::default(),
                    },
                )
                .unwrap();
            let item = PromptItem {
                source_line: i,
                text,
                input_ids: tokenizer.encode(&rendered, false).unwrap(),
                label: String::new(),
                metadata: serde_json::Value::Null,
                messages: Vec::new(),
                tools: None,
            };
            (i as u64, item)
        })
        .collect();
    let settings = RolloutSettings {
        n_samples_per_prompt: 8,
        sampling: SamplingParams {
            max_new_tokens: Some(8),
            ..Default::default()
        }
        .validate()
        .unwrap(),
        concurrency: 256,
        seed: 5,
        dynamic_sampling: false,
        min_reward_std: 0.0,
        drop_truncated_groups: false,
        mask_truncated: false,
        over_sampling_batch_size: 0,
        max_rounds: 1,
        agent: Some(AgentRollout {
            agent: Arc::new(ToolAgent { sandbox }),
            limits: AgentLimits {
                max_tokens_per_turn: 8,
                max_response_tokens: 128,
                max_context: 256,
                deadline: Duration::from_secs(300),
            },
            grace: Duration::from_secs(5),
            helpers: Default::default(),
            activity: Default::default(),
        }),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(512)
        .enable_all()
        .build()
        .unwrap();
    let scorer = Scorer::Builtin(Reward::Contains);
    let groups = rt.block_on(async {
        // A hang guard, not a speed bound: a stuck execution fails the test instead of hanging it.
        tokio::time::timeout(
            Duration::from_secs(900),
            generate_groups(&engine, &tokenizer, &scorer, prompts, 8, &settings, &|| {}),
        )
        .await
        .expect("every execution finished")
        .unwrap()
    });
    assert_eq!(groups.len(), 32);
    let mut finished = 0;
    for g in &groups {
        assert_eq!(g.samples.len(), 8);
        for s in &g.samples {
            assert!(s.error.is_none(), "{:?}", s.error);
            let text = &s.response;
            let program = g.prompt.source_line % PROGRAMS.len();
            let expected = ["42", "CPU time limit exceeded", "TIMEOUT", "TRUNCATED"][program];
            assert!(
                text.contains(expected) || (program == 1 && text.contains("TIMEOUT")),
                "program {program}: {text}"
            );
            assert_eq!(s.reward, Some((program == 0) as u8 as f64));
            finished += 1;
        }
    }
    assert_eq!(finished, 256);
}
