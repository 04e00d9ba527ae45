//! The `ooze` binary end to end on a tiny model: info, init-model, score, render, generate.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn ooze(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args(args)
        .output()
        .expect("run ooze")
}

fn ok(args: &[&str]) -> String {
    let out = ooze(args);
    assert!(
        out.status.success(),
        "ooze {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = ooze(args);
    assert!(!out.status.success(), "ooze {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

fn tiny_model(dir: &Path, family: &str) -> String {
    let path = dir.join(family);
    ok(&[
        "init-model",
        "--family",
        family,
        "--tokenizer-vocab",
        "500",
        path.to_str().unwrap(),
    ]);
    path.to_str().unwrap().to_owned()
}

#[test]
fn info_reports_the_runtime() {
    let text = ok(&["info"]);
    assert!(text.contains("PyTorch (libtorch) 2.11.0"), "{text}");
    assert!(text.contains("CUDA:"), "{text}");
    let json: Value = serde_json::from_str(&ok(&["info", "--json"])).unwrap();
    assert_eq!(json["torch_version"], "2.11.0");
}

#[test]
fn score_jsonl_in_both_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "qwen3");
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"id\": \"a\", \"tokens\": [5, 9, 13, 2, 44]}\n\n{\"id\": \"b\", \"text\": \"Question: Alice has 3 apples.\"}\n").unwrap();
    let mut runs = Vec::new();
    for layout in ["padded", "packed"] {
        let out = ok(&[
            "score",
            "--model",
            &model,
            "--input",
            input.to_str().unwrap(),
            "--entropy",
            "--layout",
            layout,
            "--device",
            "cpu",
        ]);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["id"], "a", "input fields are echoed");
        for line in &lines {
            let n = line["tokens"].as_array().unwrap().len();
            assert_eq!(line["log_probs"].as_array().unwrap().len(), n - 1);
            assert_eq!(line["entropy"].as_array().unwrap().len(), n - 1);
            assert!(line["log_probs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|v| v.as_f64().unwrap() <= 0.0));
        }
        runs.push(lines);
    }
    for (a, b) in runs[0].iter().zip(&runs[1]) {
        for (x, y) in a["log_probs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(b["log_probs"].as_array().unwrap())
        {
            assert!(
                (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-5,
                "padded and packed disagree"
            );
        }
    }
}

#[test]
fn score_names_the_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "qwen2");
    let input = dir.path().join("bad.jsonl");
    let cases = [
        (
            "{\"tokens\": [1, 2]}\n{\"tokens\": [1, -2]}\n",
            "bad.jsonl:2: `tokens` must be a list of non-negative token ids",
        ),
        (
            "{\"tokens\": [1]}\n",
            "bad.jsonl:1: a sequence needs at least 2 tokens",
        ),
        ("[1, 2]\n", "bad.jsonl:1: expected a JSON object"),
        ("{\"text\": 5}\n", "bad.jsonl:1: `text` must be a string"),
        (
            "{\"id\": 1}\n",
            "bad.jsonl:1: expected a `tokens` list or a `text` string",
        ),
        (
            "{\"tokens\": [1, 100000]}\n",
            "token id 100000, outside the vocabulary",
        ),
    ];
    for (content, expected) in cases {
        std::fs::write(&input, content).unwrap();
        let err = fails(&[
            "score",
            "--model",
            &model,
            "--input",
            input.to_str().unwrap(),
        ]);
        assert!(err.contains(expected), "{content:?}: {err}");
    }
    let missing = dir.path().join("nope");
    let err = fails(&[
        "score",
        "--model",
        missing.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(err.contains("config.json: cannot read"), "{err}");
}

#[test]
fn render_returns_text_ids_and_assistant_spans() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "llama");
    let messages = dir.path().join("messages.json");
    std::fs::write(&messages, r#"[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "bye"}]"#).unwrap();
    let out: Value = serde_json::from_str(&ok(&[
        "render",
        "--model",
        &model,
        "--messages",
        messages.to_str().unwrap(),
        "--add-generation-prompt",
    ]))
    .unwrap();
    let text = out["text"].as_str().unwrap();
    assert!(
        text.starts_with(
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        ),
        "{text}"
    );
    assert!(
        text.ends_with("<|start_header_id|>assistant<|end_header_id|>\n\n"),
        "{text}"
    );
    let spans = out["assistant_spans"].as_array().unwrap();
    assert_eq!(spans.len(), 1);
    let span = &spans[0];
    assert_eq!(
        &text[span["start_byte"].as_u64().unwrap() as usize
            ..span["end_byte"].as_u64().unwrap() as usize],
        "hello there<|eot_id|>"
    );
    let ids: Vec<u64> = out["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let (s, e) = (
        span["start_token"].as_u64().unwrap() as usize,
        span["end_token"].as_u64().unwrap() as usize,
    );
    assert!(s < e && e <= ids.len());
    let tools = dir.path().join("tools.json");
    std::fs::write(&tools, "{\"not\": \"a list\"}").unwrap();
    let err = fails(&[
        "render",
        "--model",
        &model,
        "--messages",
        messages.to_str().unwrap(),
        "--tools",
        tools.to_str().unwrap(),
    ]);
    assert!(
        err.contains("tools.json: expected a JSON list of tool schemas"),
        "{err}"
    );
    std::fs::write(&messages, r#"[{"content": "no role"}]"#).unwrap();
    let err = fails(&[
        "render",
        "--model",
        &model,
        "--messages",
        messages.to_str().unwrap(),
    ]);
    assert!(
        err.contains("message 0 must be an object with a string `role`"),
        "{err}"
    );
}

#[test]
fn generate_is_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "qwen2");
    let greedy = [
        "generate",
        "--model",
        &model,
        "--prompt",
        "Question: Bob has",
        "--max-new-tokens",
        "12",
        "--temperature",
        "0",
        "--ignore-eos",
        "--device",
        "cpu",
    ];
    let a = ok(&greedy);
    assert_eq!(a, ok(&greedy), "greedy decoding must be deterministic");
    assert!(!a.trim().is_empty());
    let sampled = [
        "generate",
        "--model",
        &model,
        "--prompt",
        "hello",
        "--chat",
        "--max-new-tokens",
        "12",
        "--top-p",
        "0.9",
        "--top-k",
        "50",
        "--seed",
        "7",
        "--device",
        "cpu",
    ];
    assert_eq!(ok(&sampled), ok(&sampled), "same seed, same sample");
    let err = fails(&[
        "generate", "--model", &model, "--prompt", "x", "--top-p", "1.5",
    ]);
    assert!(err.contains("--top-p must be in (0, 1]"), "{err}");
}

#[test]
fn generate_refuses_bad_temperatures_and_survives_tiny_ones() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "qwen2");
    let run = |temperature: &str| {
        ooze(&[
            "generate",
            "--model",
            &model,
            "--prompt",
            "Question: Bob has",
            "--max-new-tokens",
            "6",
            &format!("--temperature={temperature}"),
            "--ignore-eos",
            "--device",
            "cpu",
        ])
    };
    for bad in ["nan", "inf", "-1"] {
        let out = run(bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--temperature {bad} should fail");
        assert!(
            err.contains("--temperature must be a finite number ≥ 0 (0 = greedy)"),
            "--temperature {bad}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    for tiny in ["1e-300", "1e-7"] {
        let out = run(tiny);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "--temperature {tiny}: {err}");
        assert!(err.contains("6 generated tokens"), "{err}");
    }
    // Tiny temperatures draw the argmax, as greedy decoding does.
    assert_eq!(run("1e-300").stdout, run("0").stdout);
}

#[test]
fn bench_train_writes_a_chrome_trace_of_its_timed_steps() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "qwen2");
    let trace = dir.path().join("steps.json");
    let out = ooze(&[
        "bench",
        "train",
        "--model",
        &model,
        "--device",
        "cpu",
        "--batch",
        "2",
        "--seq-len",
        "32",
        "--iters",
        "2",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("trace written to"), "{err}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().expect("a Chrome trace");
    // The steps' operations are there: the matrix products of the forward and backward passes.
    assert!(
        events
            .iter()
            .any(|e| e["cat"] == "cpu_op" && e["name"].as_str().unwrap_or("").contains("mm")),
        "no matrix product among {} events",
        events.len()
    );
}

#[test]
fn bench_generate_puts_its_steady_decode_steps_against_the_roofline() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), "qwen2");
    let out = ooze(&[
        "bench",
        "generate",
        "--model",
        &model,
        "--device",
        "cpu",
        "--batch",
        "1",
        "--input-len",
        "8",
        "--output-len",
        "5",
    ]);
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{err}");
    // One sequence, so that no prefill can fall between its decode steps (two may be admitted
    // in one prefill or in two, as their submissions race the engine): the prefill draws the
    // first token, decode steps 1..=4 the rest, the first right after the prefill (not counted),
    // step k attending 8 + k positions: steps 2..=4, (10 + 11 + 12) / 3 = 11 positions a step.
    // The warm-up requests before the timed run are not counted either.
    assert!(
        stdout.contains("decode steps without a prefill: 3 of ")
            && stdout.contains("1 sequences and 11 key positions a step"),
        "{stdout}"
    );
    let share = stdout
        .lines()
        .find_map(|l| l.strip_prefix("roofline: "))
        .and_then(|l| l.rsplit("reaches ").next())
        .and_then(|l| l.strip_suffix("% of it"))
        .and_then(|p| p.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no roofline share in {stdout}"));
    assert!(share > 0.0, "{stdout}");
}
