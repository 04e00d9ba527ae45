//! Models made by `init_model` are real Hugging Face checkpoints: ooze loads them through the
//! normal path, and transformers loads the weights, the tokenizer and the chat template and agrees
//! with ooze on log-probs, rendered text and token ids.

mod common;

use common::*;
use ooze_model::init::{init_model, InitOptions, Size};
use ooze_model::{
    score_sequences, Decoder, Family, Layout, RenderOptions, ScoreOptions, Tokenizer,
};
use ooze_torch::tch::{Device, Kind};
use serde_json::json;

fn conversations() -> Vec<(
    serde_json::Value,
    Option<serde_json::Value>,
    serde_json::Value,
    bool,
)> {
    let tools = json!([{"type": "function", "function": {"name": "python", "description": "Run code", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}]);
    vec![
        (
            json!([{"role": "user", "content": "Question: Alice has 3 apples. How many?"}]),
            None,
            json!({}),
            true,
        ),
        (
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"}]),
            None,
            json!({}),
            true,
        ),
        (
            json!([{"role": "user", "content": "run it"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "python", "arguments": {"code": "print(1)"}}}]}, {"role": "tool", "content": "1"}]),
            Some(tools.clone()),
            json!({}),
            true,
        ),
        (
            json!([{"role": "user", "content": "think"}, {"role": "assistant", "reasoning_content": "ok", "content": "done"}]),
            None,
            json!({"enable_thinking": false}),
            false,
        ),
        (
            json!([{"role": "user", "content": "quick"}]),
            None,
            json!({"enable_thinking": false}),
            true,
        ),
    ]
}

#[test]
fn init_models_load_in_ooze_and_transformers_alike() {
    let corpus = ooze_model::corpus::generate(1, 60_000);
    for family in [Family::Qwen2, Family::Qwen3, Family::Llama] {
        let dir = tempfile::tempdir().unwrap();
        let mut options = InitOptions::new(family, Size::Tiny);
        options.tokenizer_vocab = 600;
        options.tie_word_embeddings = family != Family::Qwen2;
        options.max_shard_bytes = 150_000;
        let config = init_model(dir.path(), &corpus, &options).unwrap();
        let decoder = Decoder::load(dir.path(), Device::Cpu, Kind::Float).unwrap();
        assert_eq!(decoder.config, config);
        let tokenizer = Tokenizer::load(dir.path()).unwrap();
        assert_eq!(tokenizer.vocab_size() as i64, config.vocab_size);
        let sequences: Vec<Vec<u32>> = [
            "Question: Bob has 12 coins and buys 3 more.",
            "def f(x):\n    return x * 2",
            "the agent will search the file",
        ]
        .iter()
        .map(|t| tokenizer.encode(t, true).unwrap())
        .collect();
        let scores = score_sequences(
            &decoder,
            &sequences,
            Layout::Padded,
            &ScoreOptions::default(),
        )
        .unwrap();
        let mut chat = Vec::new();
        for (messages, tools, kwargs, gen) in conversations() {
            let options = RenderOptions {
                add_generation_prompt: gen,
                tools: tools.as_ref().and_then(|t| t.as_array().cloned()),
                kwargs: kwargs.as_object().cloned().unwrap(),
            };
            let text = tokenizer
                .chat_template(tools.is_some())
                .unwrap()
                .render(messages.as_array().unwrap(), &options)
                .unwrap();
            let ids = tokenizer.encode(&text, false).unwrap();
            chat.push(json!({"messages": messages, "tools": tools, "kwargs": kwargs, "add_generation_prompt": gen, "text": text, "ids": ids}));
        }
        let expected = json!({
            "sequences": sequences.iter().zip(&scores).map(|(s, sc)| json!({"tokens": s, "log_probs": sc.log_probs})).collect::<Vec<_>>(),
            "chat": chat,
        });
        let expected_path = dir.path().join("ooze_expected.json");
        std::fs::write(&expected_path, expected.to_string()).unwrap();
        run_python("check_checkpoint.py", &[dir.path(), &expected_path]);
    }
}

#[test]
fn tiny_models_depend_only_on_the_seed() {
    let corpus = ooze_model::corpus::generate(2, 20_000);
    let make = |seed| {
        let dir = tempfile::tempdir().unwrap();
        let mut options = InitOptions::new(Family::Llama, Size::Tiny);
        options.seed = seed;
        options.tokenizer_vocab = 400;
        init_model(dir.path(), &corpus, &options).unwrap();
        let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
        (read("model.safetensors"), read("tokenizer.json"))
    };
    let (a, ta) = make(5);
    let (b, tb) = make(5);
    let (c, _) = make(6);
    assert!(a == b && ta == tb, "same seed, different files");
    assert_ne!(a, c, "different seeds, same weights");
}

/// A tokenizer corpus given as chat JSONL is rendered with the family's chat template first: the
/// vocabulary learns the template's own text and the tool schema as the model will see them, so a
/// rendered conversation takes far fewer tokens than with a tokenizer that saw the raw rows.
#[test]
fn chat_jsonl_corpora_are_rendered_with_the_chat_template() {
    let row = |i: usize| {
        json!({"messages": [
            {"role": "system", "content": "You are the shop's assistant."},
            {"role": "user", "content": format!("How much does item {i} cost?")},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "lookup_price", "arguments": {"item": format!("item {i}")}}}]},
            {"role": "tool", "content": format!("${}", 10 + i % 90)},
            {"role": "assistant", "content": format!("It costs ${}.", 10 + i % 90)}],
          "tools": [{"type": "function", "function": {"name": "lookup_price", "description": "The price of one item.", "parameters": {"type": "object", "properties": {"item": {"type": "string"}}}}}]})
        .to_string()
    };
    let jsonl: String = (0..300).map(|i| row(i) + "\n").collect();
    let rendered =
        ooze_model::init::render_chat_corpus(Family::Qwen2, &jsonl, "demo.jsonl").unwrap();
    let one = ooze_model::init::render_chat_corpus(Family::Qwen2, &row(7), "demo.jsonl").unwrap();
    assert!(rendered.contains("<tools>") && rendered.contains("<|im_start|>assistant"));
    assert!(rendered.contains("\"name\": \"lookup_price\""));
    let tokens = |corpus: &str| {
        let dir = tempfile::tempdir().unwrap();
        let mut options = InitOptions::new(Family::Qwen2, Size::Tiny);
        options.tokenizer_vocab = 600;
        init_model(dir.path(), corpus, &options).unwrap();
        let tokenizer = Tokenizer::load(dir.path()).unwrap();
        tokenizer.encode(&one, false).unwrap().len()
    };
    let (on_rendered, on_raw) = (tokens(&rendered), tokens(&jsonl));
    assert!(
        on_rendered * 10 < on_raw * 8,
        "rendered {on_rendered}, raw {on_raw}"
    );

    let bad = format!("{}\n\n{{\"messages\": 3}}\n", row(0));
    let err = ooze_model::init::render_chat_corpus(Family::Qwen2, &bad, "demo.jsonl").unwrap_err();
    assert!(
        err.to_string().contains("demo.jsonl:3") && err.to_string().contains("`messages`"),
        "{err}"
    );
    let err = ooze_model::init::render_chat_corpus(Family::Qwen2, "not json\n", "demo.jsonl")
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("demo.jsonl:1: expected a JSON object"),
        "{err}"
    );
}
