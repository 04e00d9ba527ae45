//! Shared by the integration tests: `ooze serve` on a free port, a scripted tool-calling model,
//! agent warm starts, and the GPU tests' engine runs.

use ooze_model::checkpoint::{save_weights, SaveOptions};
use ooze_model::init::{init_model, random_weights, InitOptions, Size};
use ooze_model::{Family, ModelConfig, Tokenizer};
use ooze_torch::tch::{Kind, Tensor};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `scripts/reference/SCRIPT ARGS…` with the repository's Python (`$OOZE_PYTHON`, else
/// `.venv/bin/python`) and asserts it succeeded, showing its output when not.
#[allow(dead_code)] // not every test crate runs the reference scripts
pub fn reference_check(script: &str, args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("OOZE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let out = Command::new(python)
        .arg(root.join("scripts/reference").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A directory that `build` fills once for all the test processes of one build: nextest runs each
/// test in a process of its own, so a fixture several tests of one test binary share (a
/// warm-started model) lives under the target directory, in `fixtures/NAME/` keyed by the
/// modification times of `ooze` and of that test binary, and the first test to need it builds it
/// under an exclusive lock (`fixtures/NAME.lock`) while the others wait. Builds for older binaries
/// (and a crashed build's partial directory) are removed when a new one starts. One test binary
/// per name: another would replace the fixture under the first one's tests.
#[allow(dead_code)] // not every test crate shares a fixture
pub fn shared_fixture(name: &str, build: impl FnOnce(&Path)) -> PathBuf {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    };
    let key = format!(
        "{:x}-{:x}",
        stamp(Path::new(env!("CARGO_BIN_EXE_ooze"))),
        stamp(&std::env::current_exe().unwrap())
    );
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fixtures");
    let own = root.join(name);
    std::fs::create_dir_all(&own).unwrap();
    let _lock = ooze_env::FileLock::take(&root.join(format!("{name}.lock"))).unwrap();
    let dir = own.join(&key);
    if !dir.is_dir() {
        for entry in std::fs::read_dir(&own).unwrap().flatten() {
            std::fs::remove_dir_all(entry.path()).unwrap();
        }
        let partial = own.join(format!("{key}.partial"));
        std::fs::create_dir(&partial).unwrap();
        build(&partial);
        std::fs::rename(&partial, &dir).unwrap();
    }
    dir
}

/// A running `ooze serve`, stopped when dropped.
#[allow(dead_code)] // not every test crate that shares this module serves
pub struct Server(
    std::process::Child,
    std::sync::Arc<std::sync::Mutex<String>>,
);

impl Server {
    /// What the server has written to stderr so far.
    #[allow(dead_code)]
    pub fn log(&self) -> String {
        self.1.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ooze serve --model MODEL` on the CPU on a free port with `extra` flags; returns it with
/// its OpenAI base URL. Its log keeps being read, so the server never writes into a closed pipe.
#[allow(dead_code)]
pub fn serve(model: &Path, extra: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args(["serve", "--port", "0", "--device", "cpu"])
        .args(extra)
        .arg("--model")
        .arg(model)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let server = Server(child, log.clone());
    let addr = loop {
        let line = lines.next().expect("ooze serve exited").unwrap();
        // "… listening on http://ADDR (at most N connections)"
        if let Some(addr) = line.split("on http://").nth(1) {
            break addr
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
        }
    };
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let mut l = log.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    (server, format!("http://{addr}/v1"))
}

/// Runs `ooze ARGS` (no stdin) and returns its output; fails the test, with its stderr, if it
/// fails.
#[allow(dead_code)] // not every test crate that shares this module runs the CLI this way
pub fn ooze_ok(args: &[&str]) -> std::process::Output {
    ooze_ok_with(args, &[])
}

/// A tiny random Qwen2-family chat model written by `ooze init-model` into `dir/model`.
#[allow(dead_code)]
pub fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    ooze_ok(&[
        "init-model",
        "--family",
        "qwen2",
        "--size",
        "tiny",
        model.to_str().unwrap(),
    ]);
    model
}

/// [`ooze_ok`] with environment variables `envs` set.
#[allow(dead_code)]
pub fn ooze_ok_with(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ooze {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// How long a warm start fine-tunes: steps of `batch` conversations.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy)]
pub struct SftSteps {
    pub steps: usize,
    pub batch: usize,
}

#[allow(dead_code)]
impl SftSteps {
    /// What the agents of short conversations need to act in their demonstrations' format (the
    /// tests need that, not a good agent).
    pub const DEFAULT: SftSteps = SftSteps {
        steps: 120,
        batch: 16,
    };
}

/// Warm-starts a tiny model for agent `recipe` in `dir`: `init-model` writes a tiny random Qwen2
/// into `dir/model`, `recipe-data` writes `n` prompts with worked trajectories (and `data_args`)
/// into `dir/data`, `edit` may rewrite the demonstrations (`dir/data/sft.jsonl`), and `ooze sft`
/// fine-tunes the model on them (`sft`) into `dir/sft`. Returns the fine-tuned model's directory
/// (`dir/sft/final-model`).
#[allow(dead_code)] // not every test crate that shares this module warm-starts an agent
pub fn agent_warm_start(
    recipe: &str,
    dir: &Path,
    n: usize,
    sft: SftSteps,
    data_args: &[&str],
    edit: &dyn Fn(&Path),
) -> PathBuf {
    let ooze = |args: &[&str]| {
        ooze_ok(args);
    };
    let p = |name: &str| dir.join(name).display().to_string();
    let n = n.to_string();
    let model = p("model");
    ooze(&["init-model", "--family", "qwen2", "--size", "tiny", &model]);
    let mut data = vec!["recipe-data", recipe];
    let data_dir = p("data");
    data.extend([data_dir.as_str(), "--n", n.as_str(), "--demonstrations"]);
    // Recorded from the recipe's agent, rendered with this model's tokenizer and chat template.
    data.extend(["--model", model.as_str()]);
    data.extend_from_slice(data_args);
    ooze(&data);
    edit(&dir.join("data/sft.jsonl"));
    // One thread: the callers warm-start several agents at once on two cores.
    ooze_ok_with(
        &[
            "sft",
            "--model",
            &model,
            "--data",
            &p("data/sft.jsonl"),
            "--out",
            &p("sft"),
            "--device",
            "cpu",
            "--batch-size",
            &sft.batch.to_string(),
            "--lr",
            "5e-3",
            "--warmup-steps",
            "10",
            "--max-steps",
            &sft.steps.to_string(),
            "--save-every",
            "100000",
            "--eval-every",
            "100000",
        ],
        &[("OMP_NUM_THREADS", "1")],
    );
    dir.join("sft/final-model")
}

/// The call the scripted model makes.
const TOOL_CALL: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;

/// A tiny Qwen2 model that is a pure bigram chain: attention and MLP outputs are zero, so the
/// logits depend on the current token only, and each token of
/// `\n → <tool_call> → TOOL_CALL → </tool_call> → <|im_end|>` predicts the next one by a wide
/// margin. The chat template's generation prompt ends in `\n`, so every chat is answered with the
/// tool call. TOOL_CALL is one added token (the chain needs distinct tokens).
#[allow(dead_code)] // not every test crate that shares this module serves it
pub fn scripted_tool_model(dir: &Path) {
    let mut options = InitOptions::new(Family::Qwen2, Size::Tiny);
    options.tokenizer_vocab = 500;
    options.vocab_size = Some(512);
    options.tie_word_embeddings = false;
    init_model(dir, &ooze_model::corpus::generate(5, 30_000), &options).unwrap();

    let path = dir.join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let next_id = Tokenizer::load(dir).unwrap().vocab_size();
    assert!(next_id < 512, "room for the added token");
    tokenizer["added_tokens"].as_array_mut().unwrap().push(
        serde_json::json!({"id": next_id, "content": TOOL_CALL, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": false}),
    );
    std::fs::write(&path, tokenizer.to_string()).unwrap();

    let tokenizer = Tokenizer::load(dir).unwrap();
    let id = |text: &str| {
        let ids = tokenizer.encode(text, false).unwrap();
        assert_eq!(ids.len(), 1, "{text:?} is one token");
        ids[0] as usize
    };
    let chain = [
        id("\n"),
        id("<tool_call>"),
        id(TOOL_CALL),
        id("</tool_call>"),
        id("<|im_end|>"),
    ];
    let config = ModelConfig::load(dir).unwrap();
    let (vocab, hidden) = (config.vocab_size as usize, config.hidden_size as usize);
    assert!(chain.len() < hidden);
    let mut embed = vec![0f32; vocab * hidden];
    let mut head = vec![0f32; vocab * hidden];
    for (i, pair) in chain.windows(2).enumerate() {
        // Token pair[0] is the unit vector e_i; the head maps e_i to token pair[1].
        embed[pair[0] * hidden + i] = 1.0;
        head[pair[1] * hidden + i] = 4.0;
    }
    let matrix = |values: &[f32]| Tensor::from_slice(values).view([vocab as i64, hidden as i64]);
    let weights: Vec<(String, Tensor)> = random_weights(&config, 1)
        .into_iter()
        .map(|(name, t)| {
            let t = if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
                t.zeros_like()
            } else if name == "model.embed_tokens.weight" {
                matrix(&embed)
            } else if name == "lm_head.weight" {
                matrix(&head)
            } else {
                t
            };
            (name, t)
        })
        .collect();
    save_weights(
        dir,
        &weights,
        SaveOptions {
            max_shard_bytes: 1 << 30,
            kind: Kind::Float,
        },
    )
    .unwrap();
}

/// Runs every prompt through the engine at once; the outputs in prompt order.
#[allow(dead_code)] // the GPU tests' helper
pub fn generate_all(
    runtime: &tokio::runtime::Runtime,
    engine: &ooze_engine::EngineHandle,
    prompts: &[Vec<u32>],
    sampling: &ooze_engine::Sampling,
) -> Vec<ooze_engine::Output> {
    runtime.block_on(async {
        // Paused while they are submitted, the engine admits them all at once: which requests
        // share a pass must not depend on how fast this thread submits.
        engine.pause(ooze_engine::PauseMode::InPlace);
        let streams: Vec<_> = prompts
            .iter()
            .map(|p| {
                engine
                    .submit(ooze_engine::Request {
                        input_ids: p.clone(),
                        sampling: sampling.clone(),
                        session: None,
                    })
                    .unwrap()
                    .1
            })
            .collect();
        engine.resume();
        let mut outs = Vec::new();
        for mut rx in streams {
            while let Some(event) = rx.recv().await {
                if let ooze_engine::Event::Done(out) = event {
                    outs.push(out);
                }
            }
        }
        outs
    })
}

/// A random `family` model of `size` (its tokenizer trained on the built-in corpus), seeded
/// `seed`, in a fresh temporary directory: the GPU tests' models.
#[allow(dead_code)] // the GPU tests' helper
pub fn random_model(family: Family, size: Size, seed: i64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut options = InitOptions::new(family, size);
    options.seed = seed;
    init_model(
        dir.path(),
        &ooze_model::corpus::generate(0, 50_000),
        &options,
    )
    .unwrap();
    dir
}
