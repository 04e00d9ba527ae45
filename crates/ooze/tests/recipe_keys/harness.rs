//! The runs behind the recipe-key cases: two tiny random models, prompt files, a corpus, a remote
//! reward model over HTTP, the command agent's program, `ooze train` on the CPU, and what a run
//! left behind.

use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// The recipe every case starts from: one rollout of 2 prompts × 2 samples of 6 tokens, scored by
/// the test's reward server (a reward with spread, so advantages and gradients are not zero).
pub const BASE: &str = r#"
[model]
path = "{model}"
device = "cpu"

[data]
task = "addition"
task_size = 64

[rollout]
num_rollouts = 1
batch_size = 2
n_samples_per_prompt = 2
max_new_tokens = 6

[reward]
type = "remote"
url = "{url}/score"

[trainer]
lr = 1e-3

[logging]
tensorboard = false
report = false
progress = false
"#;

/// The shared files and services; `fill` replaces `{name}` placeholders with them.
pub struct Env {
    pub dir: tempfile::TempDir,
    vars: Vec<(&'static str, String)>,
    _teacher: Option<super::common::Server>,
}

fn ooze() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ooze"));
    c.env("OMP_NUM_THREADS", "1").stdin(Stdio::null());
    c
}

fn init_model(path: &Path, seed: &str) {
    let path = path.display().to_string();
    crate::common::ooze_ok(&[
        "init-model",
        "--family",
        "qwen2",
        "--size",
        "tiny",
        "--seed",
        seed,
        &path,
    ]);
}

impl Env {
    pub fn new() -> Env {
        let mut dir = tempfile::tempdir().unwrap();
        if std::env::var_os("RECIPE_KEYS_KEEP").is_some() {
            dir.disable_cleanup(true);
            eprintln!("recipe_keys: the runs stay in {}", dir.path().display());
        }
        let p = |name: &str| dir.path().join(name);
        init_model(&p("model"), "0");
        init_model(&p("model2"), "7");
        // Eight rows with every column the data keys can pick; row 8 is long (for
        // data.max_prompt_tokens).
        let mut rows = String::new();
        for i in 0..8 {
            let prompt = if i == 7 {
                "tell me a long story ".repeat(40)
            } else {
                format!("what is {i} + {i}?")
            };
            let row = serde_json::json!({
                "prompt": prompt,
                "q": format!("name the number {i}"),
                "label": (2 * i).to_string(),
                "answer": format!("a{i}"),
                "meta": {"row": i},
                "tools": [{"type": "function", "function": {"name": "add", "description": "adds",
                    "parameters": {"type": "object", "properties": {}}}}],
            });
            rows.push_str(&format!("{row}\n"));
        }
        std::fs::write(p("data.jsonl"), &rows).unwrap();
        // The Python reward's rows: an interpreter wrapper the reward can tell it ran under.
        std::fs::write(
            p("py"),
            "#!/bin/sh\nOOZE_TEST_WRAPPED=1 exec python3 \"$@\"\n",
        )
        .unwrap();
        std::fs::set_permissions(p("py"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut mem = String::new();
        for i in 0..4 {
            let row = serde_json::json!({
                "prompt": format!("question {i}"),
                "context": format!("the number is {i}. ").repeat(30),
                "question": "what is the number?",
                "label": i.to_string(),
            });
            mem.push_str(&format!("{row}\n"));
        }
        std::fs::write(p("mem.jsonl"), mem).unwrap();
        std::fs::write(p("bad.jsonl"), format!("{rows}{{\"question\": \"x\"}}\n")).unwrap();
        std::fs::write(
            p("corpus.jsonl"),
            "{\"id\": \"1\", \"contents\": \"Paris\\nThe capital of France.\"}\n\
             {\"id\": \"2\", \"contents\": \"Rome\\nThe capital of Italy.\"}\n",
        )
        .unwrap();
        // Tiny models warm-started on each agent's demonstrations (they search, call the
        // interpreter, plan tool steps, call experts), built at once on the two cores.
        std::thread::scope(|s| {
            for recipe in WARM {
                let dir = dir.path().join(format!("warm-{recipe}"));
                s.spawn(move || {
                    crate::common::agent_warm_start(
                        recipe,
                        &dir,
                        if recipe == "endless_terminals" {
                            80
                        } else {
                            200
                        },
                        crate::common::SftSteps::DEFAULT,
                        &[],
                        &|sft| match recipe {
                            "tool_orchestra" => vary_orchestration(sft),
                            "agentflow" => {
                                planner_only(sft);
                                good_habit_only(sft, "Tool: python_coder");
                            }
                            "search_r1" => good_habit_only(sft, "<search>"),
                            "endless_terminals" => {
                                terminal_family_only(sft);
                                terminal_family_only(&sft.with_file_name("train.jsonl"));
                            }
                            _ => good_habit_only(sft, "<tool_call>"),
                        },
                    )
                });
            }
        });
        // search_r1's questions with the gold answer "matched": the text of a search that found
        // nothing ("No documents matched the query.") holds it, so a well-formed wrong answer
        // after such a search earns format_reward.retrieval.
        let questions = std::fs::read_to_string(p("warm-search_r1/data/train.jsonl")).unwrap();
        let matched: String = questions
            .lines()
            .map(|l| {
                let row: Value = serde_json::from_str(l).unwrap();
                format!(
                    "{}\n",
                    serde_json::json!({"prompt": row["prompt"], "label": "matched"})
                )
            })
            .collect();
        std::fs::write(p("search_matched.jsonl"), matched).unwrap();
        // The command agent's program, and a working directory it recognises.
        std::fs::write(p("command_agent.py"), include_str!("command_agent.py")).unwrap();
        std::fs::create_dir(p("command-cwd")).unwrap();
        std::fs::write(p("command-cwd/command-agent-cwd"), "").unwrap();
        // tau_retail's rows: generated scenarios, and a policy that always calls a tool (one the
        // store does not have, so every call comes back as the same long error).
        let tau = p("tau").display().to_string();
        super::common::ooze_ok(&["recipe-data", "tau_retail", &tau, "--n", "8"]);
        super::common::scripted_tool_model(&p("tool-model"));
        let url = reward_server();
        let experts = format!("{url}/v1");
        // The teacher server serves the policy's own starting weights.
        let (teacher, teacher_url) = super::common::serve(&p("model"), &[]);
        let teacher_url = teacher_url.trim_end_matches("/v1").to_owned();
        let s = |p: PathBuf| p.display().to_string();
        let vars = vec![
            ("{model}", s(p("model"))),
            ("{model2}", s(p("model2"))),
            ("{data}", s(p("data.jsonl"))),
            ("{bad_data}", s(p("bad.jsonl"))),
            ("{mem_data}", s(p("mem.jsonl"))),
            ("{corpus}", s(p("corpus.jsonl"))),
            ("{search_matched}", s(p("search_matched.jsonl"))),
            ("{command_agent}", s(p("command_agent.py"))),
            ("{tau_data}", s(p("tau/train.jsonl"))),
            ("{tool_model}", s(p("tool-model"))),
            ("{command_cwd}", s(p("command-cwd"))),
            ("{dir}", s(dir.path().to_owned())),
            (
                "{rewards}",
                s(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/recipe_keys/rewards.py")),
            ),
            ("{py}", s(p("py"))),
            ("{url}", url),
            ("{teacher}", teacher_url),
        ];
        let mut vars = vars;
        for recipe in WARM {
            vars.push((
                warm_var(recipe),
                s(dir.path().join(format!("warm-{recipe}"))),
            ));
        }
        vars.push(("{experts}", experts));
        std::fs::write(p("base.toml"), fill(&vars, BASE)).unwrap();
        Env {
            dir,
            vars,
            _teacher: Some(teacher),
        }
    }

    pub fn fill(&self, text: &str) -> String {
        fill(&self.vars, text)
    }

    /// `ooze train base.toml` with `sets` (placeholders filled) into `runs/NAME`.
    pub fn train(&self, name: &str, sets: &[String]) -> Out {
        let run = self.dir.path().join("runs").join(name);
        let mut cmd = ooze();
        cmd.arg("train").arg(self.dir.path().join("base.toml"));
        cmd.arg("--set")
            .arg(format!("logging.run_dir=\"{}\"", run.display()));
        for s in sets {
            cmd.arg("--set").arg(self.fill(s));
        }
        let out = cmd.output().unwrap();
        Out::read(run, out.status.success(), &out.stderr)
    }
}

/// The agents with a warm-started model: `{warm_NAME}/sft/final-model`, `{warm_NAME}/data/`.
const WARM: [&str; 5] = [
    "search_r1",
    "retool",
    "agentflow",
    "tool_orchestra",
    "endless_terminals",
];

fn warm_var(recipe: &str) -> &'static str {
    match recipe {
        "search_r1" => "{warm_search_r1}",
        "retool" => "{warm_retool}",
        "agentflow" => "{warm_agentflow}",
        "endless_terminals" => "{warm_endless_terminals}",
        _ => "{warm_tool_orchestra}",
    }
}

/// agentflow's demonstrations hold the planner's turns and its modules' (the recipe's modules
/// are the SFT model); here the modules are the scripted expert, so the tiny model's 120 steps go
/// to the planner alone.
fn planner_only(sft: &Path) {
    let text = std::fs::read_to_string(sft).unwrap();
    let kept: String = text
        .lines()
        .filter(|l| l.contains("You plan the next step"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!kept.is_empty(), "the demonstrations changed shape");
    std::fs::write(sft, kept).unwrap();
}

/// Keeps the demonstrations of the oracle's good habit (a reply holds `marker`): the tool keys act
/// only on a model that calls the tool, and the oracles' weak habit (answer without searching,
/// without the interpreter, plan estimates) would leave the tiny model's few samples without a
/// call in some builds.
fn good_habit_only(sft: &Path, marker: &str) {
    let text = std::fs::read_to_string(sft).unwrap();
    let kept: String = text
        .lines()
        .filter(|l| {
            let row: Value = serde_json::from_str(l).unwrap();
            row["messages"].as_array().unwrap().iter().any(|m| {
                m["role"] == "assistant" && m["content"].as_str().unwrap().contains(marker)
            })
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!kept.is_empty(), "no demonstration holds {marker}");
    std::fs::write(sft, kept).unwrap();
}

/// The instruction of the one terminal family the harness's terminal rows use (`make-executable`:
/// one short `chmod`), so that a tiny model warm-started on a handful of its demonstrations runs
/// a command on every row and the command keys act.
const TERMINAL_FAMILY: &str = "cannot be run. Give it permission mode";

/// Keeps the rows (demonstrations or prompts) of `file` that mention [`TERMINAL_FAMILY`].
fn terminal_family_only(file: &Path) {
    let text = std::fs::read_to_string(file).unwrap();
    let kept: String = text
        .lines()
        .filter(|l| l.contains(TERMINAL_FAMILY))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        !kept.is_empty(),
        "no row of {} is of the family",
        file.display()
    );
    std::fs::write(file, kept).unwrap();
}

/// The generated orchestrator demonstrations all answer at once; the warm start here learns to
/// call `reason` (4 in 10), `search` (4 in 10) and `answer` (2 in 10), so that the tool and
/// search keys act.
fn vary_orchestration(sft: &Path) {
    let text = std::fs::read_to_string(sft).unwrap();
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        let tool = ["reason", "search", "answer", "reason", "search"][i % 5];
        let line = line.replace(r#"\"name\":\"answer\""#, &format!(r#"\"name\":\"{tool}\""#));
        out.push_str(&line);
        out.push('\n');
    }
    assert!(out.contains("reason"), "the demonstrations changed shape");
    std::fs::write(sft, out).unwrap();
}

fn fill(vars: &[(&str, String)], text: &str) -> String {
    vars.iter()
        .fold(text.to_owned(), |t, (k, v)| t.replace(k, v))
}

/// What a run left: its exit, stderr, metrics lines (without wall-clock numbers), saved groups,
/// the run directory's entries and the final weights.
pub struct Out {
    pub dir: PathBuf,
    pub ok: bool,
    pub stderr: String,
    pub metrics: Vec<Map<String, Value>>,
    pub groups: Vec<Value>,
    pub entries: BTreeSet<String>,
    pub weights: Option<Vec<u8>>,
}

impl Out {
    fn read(dir: PathBuf, ok: bool, stderr: &[u8]) -> Out {
        let metrics = std::fs::read_to_string(dir.join("metrics.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let mut m: Map<String, Value> = serde_json::from_str(l).unwrap();
                m.retain(|k, _| {
                    !k.starts_with("time/")
                        && !k.ends_with("tokens_per_s")
                        && !k.starts_with("train/mismatch")
                        && !k.ends_with("/seconds")
                });
                m
            })
            .collect();
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("rollouts"))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        files.sort();
        let groups = files
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap()
                    .lines()
                    .map(|l| serde_json::from_str(l).unwrap())
                    .collect::<Vec<Value>>()
            })
            .collect();
        let entries = std::fs::read_dir(&dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let weights = std::fs::read(dir.join("final-model/model.safetensors")).ok();
        Out {
            dir,
            ok,
            stderr: String::from_utf8_lossy(stderr).into_owned(),
            metrics,
            groups,
            entries,
            weights,
        }
    }

    /// The metric's value on every line (null where a line lacks it).
    pub fn series(&self, key: &str) -> Vec<Value> {
        self.metrics
            .iter()
            .map(|m| m.get(key).cloned().unwrap_or(Value::Null))
            .collect()
    }

    /// Every sample's response token ids and log-probs.
    pub fn responses(&self) -> Vec<Value> {
        self.groups
            .iter()
            .flat_map(|g| g["samples"].as_array().cloned().unwrap_or_default())
            .map(|s| {
                serde_json::json!([s["response_ids"], s["log_probs"], s["reward"], s["trained"]])
            })
            .collect()
    }

    /// Every sample's own prompt token ids (null where it is the group's) and response ids.
    pub fn turns(&self) -> Vec<Value> {
        self.groups
            .iter()
            .flat_map(|g| g["samples"].as_array().cloned().unwrap_or_default())
            .map(|s| serde_json::json!([s["prompt_ids"], s["response_ids"]]))
            .collect()
    }

    /// Every sample's response token ids.
    pub fn response_ids(&self) -> Vec<Value> {
        self.responses().into_iter().map(|r| r[0].clone()).collect()
    }

    /// Every group's prompt (text, token ids, label, metadata), in order.
    pub fn prompts(&self) -> Vec<Value> {
        self.groups.iter().map(|g| g["prompt"].clone()).collect()
    }
}

/// A remote reward model on a free port: `POST /score` answers `{"score": s}` with `s` the
/// response's byte sum mod 3 over 2 (0, 0.5 or 1: spread within groups), plus 1 when the request
/// carries metadata; `/v1/chat/completions` is the [`scripted_expert`], `/retrieve`
/// [`every_document`]; `/double` answers twice that; `/slow` answers after 1.5 s; `/flaky` fails
/// every odd-numbered attempt of a request body with a 503 (one retry succeeds, none fails).
fn reward_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let seen = seen.clone();
            std::thread::spawn(move || {
                let _ = answer(stream, &seen);
            });
        }
    });
    format!("http://{addr}")
}

fn answer(mut stream: TcpStream, seen: &Mutex<BTreeMap<String, u32>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_owned();
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if path == "/v1/chat/completions" || path == "/retrieve" {
        let text = if path == "/retrieve" {
            every_document(&request)
        } else {
            scripted_expert(&request)
        }
        .to_string();
        return write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        );
    }
    let response = request["response"].as_str().unwrap_or("");
    let mut score = (response.bytes().map(u64::from).sum::<u64>() % 3) as f64 / 2.0;
    if !request["metadata"].is_null() {
        score += 1.0;
    }
    let (status, text) = match path.as_str() {
        "/double" => ("200 OK", format!("{{\"score\": {}}}", 2.0 * score)),
        "/slow" => {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            ("200 OK", format!("{{\"score\": {score}}}"))
        }
        "/flaky" if flaky(seen, &body) => ("503 Service Unavailable", "busy".to_owned()),
        _ => ("200 OK", format!("{{\"score\": {score}}}")),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    stream.flush()
}

/// The fixed modules of the warm-started agentflow and tool_orchestra runs: an OpenAI chat
/// completion that does what the last message asks for — Python that computes for a while and
/// prints the request's temperature and 60 words, a search query, STOP-or-CONTINUE (always CONTINUE), a yes-or-no verdict (yes),
/// or a boxed answer — with token counts of about a word each.
fn scripted_expert(request: &Value) -> Value {
    let asked = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let reply = if asked.contains("Write Python") {
        // The temperature it was asked with shows in the output: the helper's key reached it.
        format!(
            "```python\nprint(sum(range(3_000_000)))\nprint('temperature {}', 'done ' * 60)\n```",
            request["temperature"]
        )
    } else if asked.contains("search query") {
        "the capital".to_owned()
    } else if asked.contains("Reply STOP") {
        "CONTINUE".to_owned()
    } else if asked.contains("yes or no") {
        "yes".to_owned()
    } else {
        "\\boxed{0}".to_owned()
    };
    serde_json::json!({
        "id": "scripted",
        "object": "chat.completion",
        "model": request["model"],
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": reply}}],
        "usage": {"prompt_tokens": asked.split_whitespace().count(),
            "completion_tokens": reply.split_whitespace().count()},
    })
}

/// A retrieval service (Search-R1's `/retrieve`) that answers every query with `topk` (default 3)
/// made-up documents, whatever the query: the tiny warm-started model's queries match nothing in
/// a real corpus.
fn every_document(request: &Value) -> Value {
    let k = request["topk"].as_u64().unwrap_or(3);
    let queries = request["queries"].as_array().map_or(0, Vec::len);
    let docs: Vec<Value> = (1..=k)
        .map(|i| {
            serde_json::json!({"document": {"id": i.to_string(),
                "contents": format!("Document {i}\nThe text of document {i}.")}, "score": 1.0})
        })
        .collect();
    serde_json::json!({"result": vec![docs; queries]})
}

/// Whether this attempt of `body` fails: the 1st, 3rd, … of each body.
fn flaky(seen: &Mutex<BTreeMap<String, u32>>, body: &[u8]) -> bool {
    let mut seen = seen.lock().unwrap();
    let n = seen
        .entry(String::from_utf8_lossy(body).into())
        .or_default();
    *n += 1;
    *n % 2 == 1
}
