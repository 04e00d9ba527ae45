//! The agent API on a tiny random CPU model: a multi-turn conversation (in-turn observation, a
//! tool message through the chat template, stop strings) keeps exactly the engine's tokens and
//! log-probs with mask 1, appends exactly the template's tokens with mask 0, and renders back to
//! its own tokens; budgets end turns; an agent stuck past its deadline is stopped in time.

use ooze_core::{FinishReason, Status};
use ooze_engine::{start, EngineConfig, EngineHandle, SamplingParams};
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{Decoder, Family, RenderOptions, Tokenizer};
use ooze_rollout::agent::{
    run_one, Agent, AgentContext, AgentError, AgentFuture, AgentLimits, AgentOutput, AgentRollout,
};
use ooze_rollout::helpers::{Helper, HelperBackend, Helpers};
use ooze_rollout::prompts::PromptItem;
use ooze_torch::tch::{Device, Kind};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn setup() -> (tempfile::TempDir, EngineHandle, Arc<Tokenizer>) {
    let dir = tempfile::tempdir().unwrap();
    let options = InitOptions::new(Family::Qwen2, Size::Tiny);
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(3, 30_000),
        &options,
    )
    .unwrap();
    let tokenizer = Arc::new(Tokenizer::load(dir.path()).unwrap());
    let eos = vec![tokenizer.token_to_id("<|im_end|>").unwrap()];
    let decoder = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
    let engine = start(
        decoder,
        Some(tokenizer.clone()),
        EngineConfig::new(8, 512, eos),
    );
    (dir, engine, tokenizer)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `agent` under `limits`, stopped `grace` after its deadline, without helpers.
fn rollout(agent: impl Agent + 'static, limits: &AgentLimits, grace: Duration) -> AgentRollout {
    AgentRollout {
        agent: Arc::new(agent),
        limits: limits.clone(),
        grace,
        helpers: Helpers::default(),
        activity: Default::default(),
    }
}

fn prompt() -> PromptItem {
    PromptItem {
        source_line: 1,
        text: String::new(),
        input_ids: Vec::new(),
        label: String::new(),
        metadata: serde_json::Value::Null,
        messages: Vec::new(),
        tools: None,
    }
}

/// Per turn: the tokens and log-probs the engine returned, as the agent saw them grow.
type Seen = Arc<Mutex<Vec<(usize, usize)>>>;

/// Generates, appends an in-turn observation, generates, appends a tool message, generates.
struct ScriptedAgent {
    /// (start, end) of every generated segment in the response.
    seen: Seen,
}

impl Agent for ScriptedAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, _prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let mut conv = ctx.start(
                vec![json!({"role": "user", "content": "Find the river."})],
                None,
            )?;
            let mark = |conv: &ooze_rollout::agent::Conversation, before: usize| {
                self.seen
                    .lock()
                    .unwrap()
                    .push((before, conv.sample.response_length));
            };
            let before = conv.sample.response_length;
            let turn = ctx.generate(&mut conv, &["</search>", "er"]).await?;
            mark(&conv, before);
            if let Some(stop) = turn.stop_text() {
                // The stop string completes in the turn's last token: no token after it (a token
                // can carry characters past it, as " there" does past "er").
                let segment = &conv.sample.response_tokens()[before..];
                let text = |ids: &[u32]| ctx.tokenizer().decode(ids, false).unwrap();
                assert!(text(segment).contains(stop), "{turn:?}");
                assert!(
                    !text(&segment[..segment.len() - 1]).contains(stop),
                    "{turn:?}"
                );
            }
            ctx.append_text(
                &mut conv,
                "\n<information>Doc 1(Title: river) water</information>\n",
            )?;
            let before = conv.sample.response_length;
            ctx.generate(&mut conv, &["</search>"]).await?;
            mark(&conv, before);
            ctx.append_message(&mut conv, json!({"role": "tool", "content": "42"}))?;
            let before = conv.sample.response_length;
            ctx.generate(&mut conv, &[]).await?;
            mark(&conv, before);
            let response = conv.response_text(ctx.tokenizer())?;
            let mut metrics = std::collections::BTreeMap::new();
            metrics.insert("turns".into(), conv.turns as f64);
            // The history renders back to the conversation's exact tokens.
            let template = ctx.tokenizer().chat_template(false).unwrap();
            let messages = conv.messages.clone();
            let rendered_open = template
                .render(
                    &messages,
                    &RenderOptions {
                        add_generation_prompt: false,
                        tools: None,
                        kwargs: Default::default(),
                    },
                )
                .unwrap();
            Ok(AgentOutput {
                samples: vec![conv.sample],
                reward: Some(1.0),
                final_response: Some(response),
                metrics: [("rendered".to_string(), rendered_open.len() as f64)]
                    .into_iter()
                    .chain(metrics)
                    .collect(),
            })
        })
    }
}

#[test]
fn conversation_tokens_are_the_engine_s_and_the_template_s() {
    let (_dir, engine, tokenizer) = setup();
    let rt = runtime();
    let sampling = SamplingParams::default().validate().unwrap();
    let limits = AgentLimits {
        max_tokens_per_turn: 12,
        ..Default::default()
    };
    for index in 0..6 {
        let seen: Seen = Default::default();
        let agent = ScriptedAgent { seen: seen.clone() };
        let t = rt.block_on(run_one(
            &rollout(agent, &limits, Duration::from_secs(5)),
            &engine,
            &tokenizer,
            &sampling,
            7,
            0,
            index,
            &prompt(),
        ));
        assert!(t.error.is_none(), "{:?}", t.error);
        let sample = &t.output.samples[0];
        sample.check().unwrap();
        // Mask 1 exactly on the generated segments, where the log-probs are the engine's (< 0);
        // mask 0 and log-prob 0 elsewhere.
        let segments = seen.lock().unwrap().clone();
        assert_eq!(segments.len(), 3);
        for (i, (&m, &lp)) in sample
            .loss_mask
            .iter()
            .zip(&sample.rollout_log_probs)
            .enumerate()
        {
            let generated = segments.iter().any(|&(a, b)| (a..b).contains(&i));
            assert_eq!(m == 1, generated, "mask at response position {i}");
            if generated {
                assert!(lp < 0.0 && lp.is_finite());
            } else {
                assert_eq!(lp, 0.0);
            }
        }
        // No generated token after a stop string: each segment's text ends at its stop.
        let response = sample.response_tokens();
        let observation = tokenizer
            .encode(
                "\n<information>Doc 1(Title: river) water</information>\n",
                false,
            )
            .unwrap();
        let (_, end0) = segments[0];
        assert_eq!(
            &response[end0..end0 + observation.len()],
            &observation[..],
            "the in-turn observation is its own tokens, mask 0"
        );
        // The observation mask covers the environment's own text — the in-turn block and the
        // tool's answer — and not the template's tokens around the tool message.
        let observed: Vec<u32> = response
            .iter()
            .zip(&sample.observation_mask)
            .filter(|(_, &o)| o == 1)
            .map(|(&t, _)| t)
            .collect();
        assert_eq!(
            tokenizer.decode(&observed, false).unwrap(),
            "\n<information>Doc 1(Title: river) water</information>\n42"
        );
        // The whole conversation decodes to the template's rendering of its messages (with the
        // generation prompt when the last turn was a tool message the model did not answer yet).
        let text = tokenizer.decode(&sample.tokens, false).unwrap();
        assert!(
            text.contains("<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
                || text.contains("<tool_response>\n42\n</tool_response>"),
            "{text}"
        );
        assert_eq!(t.output.metrics["turns"], 3.0);
        assert_eq!(t.output.reward, Some(1.0));
    }
}

/// Checks that `render(messages)` of a conversation equals the decoded tokens exactly.
struct RoundTrip;

impl Agent for RoundTrip {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, _prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let mut conv = ctx.start(vec![json!({"role": "user", "content": "Count."})], None)?;
            for k in 0..3 {
                ctx.generate(&mut conv, &["er"]).await?;
                ctx.append_message(
                    &mut conv,
                    json!({"role": "user", "content": format!("more {k}")}),
                )?;
            }
            let template = ctx.tokenizer().chat_template(false).unwrap();
            let rendered = template
                .render(
                    &conv.messages,
                    &RenderOptions {
                        add_generation_prompt: true,
                        tools: None,
                        kwargs: Default::default(),
                    },
                )
                .unwrap();
            let decoded = ctx.tokenizer().decode(&conv.sample.tokens, false).unwrap();
            if rendered != decoded {
                return Err(AgentError::Agent(format!(
                    "rendered:\n{rendered}\ndecoded:\n{decoded}"
                )));
            }
            Ok(AgentOutput {
                samples: vec![conv.sample],
                ..Default::default()
            })
        })
    }
}

#[test]
fn appended_messages_render_back_to_the_exact_tokens() {
    let (_dir, engine, tokenizer) = setup();
    let rt = runtime();
    let sampling = SamplingParams::default().validate().unwrap();
    let limits = AgentLimits {
        max_tokens_per_turn: 10,
        ..Default::default()
    };
    for index in 0..8 {
        let t = rt.block_on(run_one(
            &rollout(RoundTrip, &limits, Duration::from_secs(5)),
            &engine,
            &tokenizer,
            &sampling,
            3,
            1,
            index,
            &prompt(),
        ));
        assert!(t.error.is_none(), "{}", t.error.unwrap());
    }
}

/// Generates until the conversation budget is spent.
struct Greedy;

impl Agent for Greedy {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, _prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let mut conv = ctx.start(vec![json!({"role": "user", "content": "Talk."})], None)?;
            let mut turns = 0;
            loop {
                let turn = ctx.generate(&mut conv, &[]).await?;
                turns += 1;
                if turn.tokens == 0 {
                    assert_eq!(turn.finish, FinishReason::Length);
                    break;
                }
                ctx.append_text(&mut conv, " and")?;
                assert!(turns < 100);
            }
            Ok(AgentOutput {
                samples: vec![conv.sample],
                ..Default::default()
            })
        })
    }
}

#[test]
fn budgets_end_the_conversation() {
    let (_dir, engine, tokenizer) = setup();
    let rt = runtime();
    let sampling = SamplingParams {
        ignore_eos: Some(true),
        ..Default::default()
    }
    .validate()
    .unwrap();
    let limits = AgentLimits {
        max_tokens_per_turn: 7,
        max_response_tokens: 30,
        ..Default::default()
    };
    let t = rt.block_on(run_one(
        &rollout(Greedy, &limits, Duration::from_secs(5)),
        &engine,
        &tokenizer,
        &sampling,
        1,
        0,
        0,
        &prompt(),
    ));
    let sample = &t.output.samples[0];
    assert!(
        sample.response_length <= 30 + 2,
        "{}",
        sample.response_length
    );
    assert_eq!(sample.status, Status::Truncated);
}

/// Never returns.
struct Stuck;

impl Agent for Stuck {
    fn run<'a>(&'a self, _ctx: &'a mut AgentContext, _prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            std::future::pending::<()>().await;
            unreachable!()
        })
    }
}

#[test]
fn a_stuck_agent_is_stopped_at_its_deadline() {
    let (_dir, engine, tokenizer) = setup();
    let rt = runtime();
    let sampling = SamplingParams::default().validate().unwrap();
    let limits = AgentLimits {
        deadline: Duration::from_millis(300),
        ..Default::default()
    };
    let started = Instant::now();
    let t = rt.block_on(run_one(
        &rollout(Stuck, &limits, Duration::from_millis(200)),
        &engine,
        &tokenizer,
        &sampling,
        1,
        0,
        0,
        &prompt(),
    ));
    assert!(t.error.unwrap().contains("deadline"));
    assert!(t.output.samples.is_empty());
    // Bounded by the deadline plus the grace, not by the agent.
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// Asks the helper `judge` twice, then generates one policy turn.
struct AsksJudge;

impl Agent for AsksJudge {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, _prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let question = [json!({"role": "user", "content": "Is 2 + 2 = 4? Answer yes or no."})];
            let a = ctx.ask_helper("judge", &question, 6, &[]).await?;
            let b = ctx.ask_helper("judge", &question, 6, &[]).await?;
            assert!(
                a.completion_tokens >= 1 && a.completion_tokens <= 6,
                "{a:?}"
            );
            assert!(a.prompt_tokens > 5 && a.prompt_tokens == b.prompt_tokens);
            // An unknown helper is an error that names the configured ones.
            let unknown = ctx.ask_helper("oracle", &question, 6, &[]).await;
            let message = unknown.unwrap_err().to_string();
            assert!(
                message.contains("\"oracle\"") && message.contains("judge"),
                "{message}"
            );
            let mut conv = ctx.start(vec![json!({"role": "user", "content": a.text})], None)?;
            ctx.generate(&mut conv, &[]).await?;
            Ok(AgentOutput {
                samples: vec![conv.sample],
                ..Default::default()
            })
        })
    }
}

#[test]
fn helpers_answer_untrained_and_are_accounted() {
    let (_dir, engine, tokenizer) = setup();
    let (_helper_dir, helper_engine, helper_tokenizer) = setup();
    let rt = runtime();
    let sampling = SamplingParams::default().validate().unwrap();
    let limits = AgentLimits {
        max_tokens_per_turn: 8,
        ..Default::default()
    };
    let judge = Helper {
        name: "judge".into(),
        backend: HelperBackend::Engine {
            engine: helper_engine,
            tokenizer: helper_tokenizer,
        },
        temperature: 0.0,
        max_tokens: 64,
        timeout: Duration::from_secs(30),
        price_per_million_tokens: 2.0,
        description: String::new(),
    };
    let mut r = rollout(AsksJudge, &limits, Duration::from_secs(5));
    r.helpers = Helpers::new([judge]);
    let t = rt.block_on(run_one(
        &r,
        &engine,
        &tokenizer,
        &sampling,
        1,
        0,
        0,
        &prompt(),
    ));
    assert!(t.error.is_none(), "{:?}", t.error);
    // Only the policy's conversation is a sample; the helper's calls are counted, not trained.
    assert_eq!(t.output.samples.len(), 1);
    let m = &t.output.metrics;
    assert_eq!(m["helper/judge/calls"], 2.0);
    let tokens = m["helper/judge/tokens"];
    assert!(tokens > 10.0, "{m:?}");
    assert!((m["helper/judge/cost"] - tokens * 2.0 / 1e6).abs() < 1e-12);
    assert!(m["helper/judge/seconds"] > 0.0);
}

/// Asks the helper, whose engine is stalled behind a long request, and must give up at the
/// execution's deadline.
struct AsksSlowHelper;

impl Agent for AsksSlowHelper {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, _prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let question = [json!({"role": "user", "content": "Write a long story."})];
            ctx.ask_helper("slow", &question, 100_000, &[]).await?;
            Ok(AgentOutput::default())
        })
    }
}

#[test]
fn a_helper_call_ends_at_the_deadline() {
    let (_dir, engine, tokenizer) = setup();
    let rt = runtime();
    let sampling = SamplingParams::default().validate().unwrap();
    let limits = AgentLimits {
        deadline: Duration::from_millis(300),
        ..Default::default()
    };
    // An HTTP helper on a port where nothing answers in time: a listener that never replies.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let slow = Helper {
        name: "slow".into(),
        backend: HelperBackend::Http {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            model: "m".into(),
            api_key: None,
        },
        temperature: 0.0,
        max_tokens: 64,
        timeout: Duration::from_secs(60),
        price_per_million_tokens: 0.0,
        description: String::new(),
    };
    let mut r = rollout(AsksSlowHelper, &limits, Duration::from_secs(5));
    r.helpers = Helpers::new([slow]);
    let started = Instant::now();
    let t = rt.block_on(run_one(
        &r,
        &engine,
        &tokenizer,
        &sampling,
        1,
        0,
        0,
        &prompt(),
    ));
    let error = t.error.unwrap();
    assert!(error.contains("helper \"slow\""), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(listener);
}
