//! Rewards of a rollout: built-in checks, the synthetic tasks' verifiers, Rust functions registered
//! by name (per sample or per group), Python functions ([`crate::python_reward`]), and a remote
//! reward model over HTTP.
//!
//! A remote reward model receives `POST {"prompt", "response", "label", "metadata"}` and answers a
//! JSON number or `{"score": number}` (or `{"reward": number}`). Failed calls are retried with
//! backoff; a call that keeps failing stops the run with the URL and the last error.

use crate::http_client::JsonClient;
use crate::python_reward::{PythonReward, PythonRewardConfig};
use crate::reward::Reward;
use crate::tasks::Task;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The `[reward]` section of a recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RewardConfig {
    /// The verifier of the data section's synthetic task.
    #[default]
    Task,
    /// 1 when the last `\\boxed{}` (or the last match of `answer_pattern`'s first group) is
    /// equivalent to the label.
    Math {
        #[serde(default)]
        answer_pattern: Option<String>,
    },
    /// SQuAD exact match against the label (or a JSON list of labels).
    ExactMatch,
    /// SQuAD token F1 against the label (or a JSON list of labels).
    F1,
    /// 1 when the response matches `pattern`.
    Regex { pattern: String },
    /// 1 when the response contains the label.
    Contains,
    /// A per-sample Rust function registered under `name` (see [`Registry`]).
    Function { name: String },
    /// A Rust function registered under `name` that scores a prompt's samples together.
    GroupFunction { name: String },
    /// A Python function, `path = "FILE.py:FUNCTION"`, run by a pool of worker processes (see
    /// [`crate::python_reward`]).
    Python {
        path: String,
        #[serde(default)]
        group: bool,
        #[serde(default)]
        workers: usize,
        #[serde(default = "default_python_timeout")]
        timeout_secs: f64,
        #[serde(default = "default_python")]
        python: String,
    },
    /// A reward model behind HTTP.
    Remote {
        url: String,
        #[serde(default = "default_timeout")]
        timeout_secs: f64,
        #[serde(default = "default_retries")]
        max_retries: u32,
    },
}

impl RewardConfig {
    /// Whether this reward reads each row's label, so a row without one is an error at load (see
    /// `DataConfig::require_label`). The built-in checks and the task verifiers compare with the
    /// label; a regex does not read it. A registered function or a remote reward model may or may
    /// not: rows without a label reach them with an empty one.
    pub fn needs_label(&self) -> bool {
        match self {
            RewardConfig::Task
            | RewardConfig::Math { .. }
            | RewardConfig::ExactMatch
            | RewardConfig::F1
            | RewardConfig::Contains => true,
            RewardConfig::Regex { .. }
            | RewardConfig::Function { .. }
            | RewardConfig::GroupFunction { .. }
            | RewardConfig::Python { .. }
            | RewardConfig::Remote { .. } => false,
        }
    }
}

fn default_timeout() -> f64 {
    30.0
}
fn default_retries() -> u32 {
    3
}
fn default_python_timeout() -> f64 {
    PythonRewardConfig::default().timeout_secs
}
fn default_python() -> String {
    PythonRewardConfig::default().python
}

/// What a reward function sees of one sample.
#[derive(Debug, Clone, Copy)]
pub struct RewardInput<'a> {
    pub prompt: &'a str,
    pub response: &'a str,
    pub label: &'a str,
    pub metadata: &'a Value,
}

pub type SampleRewardFn = dyn Fn(&RewardInput<'_>) -> f64 + Send + Sync;
pub type GroupRewardFn = dyn Fn(&[RewardInput<'_>]) -> Vec<f64> + Send + Sync;

/// Reward functions by name. The synthetic tasks' verifiers are registered as `repeat`,
/// `addition`, `arithmetic`, `countdown` and `string`; programs using ooze as a library add their own.
#[derive(Clone)]
pub struct Registry {
    samples: BTreeMap<String, Arc<SampleRewardFn>>,
    groups: BTreeMap<String, Arc<GroupRewardFn>>,
}

impl Default for Registry {
    fn default() -> Self {
        let mut r = Registry {
            samples: BTreeMap::new(),
            groups: BTreeMap::new(),
        };
        for (name, task) in [
            ("repeat", Task::Repeat),
            ("addition", Task::Addition),
            ("arithmetic", Task::Arithmetic),
            ("countdown", Task::Countdown),
            ("string", Task::String),
        ] {
            r.register(name, move |x| task.verify(x.response, x.label));
        }
        r
    }
}

impl Registry {
    pub fn register(
        &mut self,
        name: &str,
        f: impl Fn(&RewardInput<'_>) -> f64 + Send + Sync + 'static,
    ) {
        self.samples.insert(name.to_owned(), Arc::new(f));
    }

    pub fn register_group(
        &mut self,
        name: &str,
        f: impl Fn(&[RewardInput<'_>]) -> Vec<f64> + Send + Sync + 'static,
    ) {
        self.groups.insert(name.to_owned(), Arc::new(f));
    }
}

/// A reward ready to score.
#[derive(Clone)]
pub enum Scorer {
    Builtin(Reward),
    Task(Task),
    Sample(Arc<SampleRewardFn>),
    Group(Arc<GroupRewardFn>),
    Python(PythonReward),
    Remote {
        client: JsonClient,
        url: String,
        max_retries: u32,
    },
}

/// A reward that could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct RewardFailure(pub String);

impl Scorer {
    /// Builds the scorer of `config`; `task` is the data section's task (for `type = "task"`).
    pub fn new(
        config: &RewardConfig,
        task: Option<Task>,
        registry: &Registry,
    ) -> Result<Scorer, String> {
        let names = |m: Vec<&String>| m.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
        let built = |r: Result<Reward, crate::RewardError>| {
            r.map(Scorer::Builtin).map_err(|e| e.to_string())
        };
        Ok(match config {
            RewardConfig::Task => Scorer::Task(task.ok_or(
                "reward.type = \"task\" scores with the data section's task verifier, but data.task is not set; \
                 choose another reward.type (math, exact_match, f1, regex, contains, function, group_function, python, remote)",
            )?),
            RewardConfig::Math { answer_pattern } => built(Reward::math(answer_pattern.as_deref()))?,
            RewardConfig::ExactMatch => Scorer::Builtin(Reward::ExactMatch),
            RewardConfig::F1 => Scorer::Builtin(Reward::F1),
            RewardConfig::Regex { pattern } => built(Reward::regex(pattern))?,
            RewardConfig::Contains => Scorer::Builtin(Reward::Contains),
            RewardConfig::Function { name } => Scorer::Sample(
                registry.samples.get(name).cloned().ok_or_else(|| {
                    format!(
                        "reward.name: no reward function `{name}`; registered: {}",
                        names(registry.samples.keys().collect())
                    )
                })?,
            ),
            RewardConfig::GroupFunction { name } => Scorer::Group(
                registry.groups.get(name).cloned().ok_or_else(|| {
                    format!(
                        "reward.name: no group reward function `{name}`; registered: {}",
                        if registry.groups.is_empty() {
                            "none".into()
                        } else {
                            names(registry.groups.keys().collect())
                        }
                    )
                })?,
            ),
            RewardConfig::Python {
                path,
                group,
                workers,
                timeout_secs,
                python,
            } => Scorer::Python(PythonReward::start(&PythonRewardConfig {
                path: path.clone(),
                group: *group,
                workers: *workers,
                timeout_secs: *timeout_secs,
                python: python.clone(),
            })?),
            RewardConfig::Remote {
                url,
                timeout_secs,
                max_retries,
            } => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!("reward.url: expected an http:// URL, got `{url}`"));
                }
                if !(*timeout_secs > 0.0 && timeout_secs.is_finite()) {
                    return Err(format!(
                        "reward.timeout_secs: expected a positive number of seconds, got {timeout_secs}"
                    ));
                }
                Scorer::Remote {
                    client: JsonClient::new(Duration::from_secs_f64(*timeout_secs)),
                    url: url.clone(),
                    max_retries: *max_retries,
                }
            }
        })
    }

    /// Whether scoring waits on another process or the network (run it off the async threads).
    pub fn blocks(&self) -> bool {
        matches!(self, Scorer::Remote { .. } | Scorer::Python(_))
    }

    /// The rewards of one prompt's samples, in order.
    pub fn score_group(&self, samples: &[RewardInput<'_>]) -> Result<Vec<f64>, RewardFailure> {
        let rewards = match self {
            Scorer::Builtin(r) => samples
                .iter()
                .map(|s| r.score(s.response, s.label))
                .collect(),
            Scorer::Task(t) => samples
                .iter()
                .map(|s| t.verify(s.response, s.label))
                .collect(),
            Scorer::Sample(f) => samples.iter().map(|s| f(s)).collect(),
            Scorer::Group(f) => {
                let r = f(samples);
                if r.len() != samples.len() {
                    return Err(RewardFailure(format!(
                        "the group reward function returned {} rewards for {} samples",
                        r.len(),
                        samples.len()
                    )));
                }
                r
            }
            Scorer::Python(p) => p.score_group(samples)?,
            Scorer::Remote {
                client,
                url,
                max_retries,
            } => samples
                .iter()
                .map(|s| remote_score(client, url, *max_retries, s))
                .collect::<Result<Vec<_>, _>>()?,
        };
        if let Some(bad) = rewards.iter().find(|r: &&f64| !r.is_finite()) {
            return Err(RewardFailure(format!("a reward is not finite: {bad}")));
        }
        Ok(rewards)
    }
}

/// One call to a remote reward model, retried with exponential backoff.
fn remote_score(
    client: &JsonClient,
    url: &str,
    max_retries: u32,
    input: &RewardInput<'_>,
) -> Result<f64, RewardFailure> {
    let payload = json!({
        "prompt": input.prompt,
        "response": input.response,
        "label": input.label,
        "metadata": input.metadata,
    });
    let mut last = String::new();
    for attempt in 0..=max_retries {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(200 << (attempt - 1).min(6)));
        }
        match client.post_text(url, None, &payload) {
            Ok(body) => {
                return parse_score(&body)
                    .map_err(|e| RewardFailure(format!("reward model {url}: {e}")));
            }
            Err(e) => {
                let status = e.status();
                last = e.to_string();
                if status.is_some_and(|s| (400..500).contains(&s)) {
                    break; // the request itself is wrong; retrying will not help
                }
            }
        }
    }
    Err(RewardFailure(format!(
        "reward model {url}: failed after {} attempt(s): {last}",
        max_retries + 1
    )))
}

/// A reward model's answer: a number, or an object with `score` or `reward`.
fn parse_score(body: &str) -> Result<f64, String> {
    let value: Value = serde_json::from_str(body).map_err(|e| {
        format!(
            "the answer is not JSON ({e}): {}",
            body.chars().take(200).collect::<String>()
        )
    })?;
    let number = match &value {
        Value::Number(n) => n.as_f64(),
        Value::Object(o) => o
            .get("score")
            .or_else(|| o.get("reward"))
            .and_then(Value::as_f64),
        _ => None,
    };
    number.ok_or_else(|| format!("expected a number or {{\"score\": number}}, got {value}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A reward input with prompt "p" and no metadata (the reward tests' fixture).
    pub(crate) fn input<'a>(response: &'a str, label: &'a str) -> RewardInput<'a> {
        static NULL: Value = Value::Null;
        RewardInput {
            prompt: "p",
            response,
            label,
            metadata: &NULL,
        }
    }

    #[test]
    fn rewards_that_compare_with_the_label_need_one() {
        let parse = |s: &str| -> RewardConfig { serde_json::from_str(s).unwrap() };
        for t in ["task", "math", "exact_match", "f1", "contains"] {
            assert!(parse(&format!(r#"{{"type": "{t}"}}"#)).needs_label(), "{t}");
        }
        for c in [
            r#"{"type": "regex", "pattern": "x"}"#,
            r#"{"type": "function", "name": "f"}"#,
            r#"{"type": "group_function", "name": "f"}"#,
            r#"{"type": "remote", "url": "http://127.0.0.1:1/score"}"#,
        ] {
            assert!(!parse(c).needs_label(), "{c}");
        }
    }

    #[test]
    fn configs_parse_and_build() {
        let registry = Registry::default();
        let parse = |s: &str| -> RewardConfig { serde_json::from_str(s).unwrap() };
        let math = Scorer::new(&parse(r#"{"type": "math"}"#), None, &registry).unwrap();
        assert_eq!(
            math.score_group(&[input(r"\boxed{4}", "4"), input("5", "4")])
                .unwrap(),
            vec![1.0, 0.0]
        );
        let task =
            Scorer::new(&parse(r#"{"type": "task"}"#), Some(Task::String), &registry).unwrap();
        assert_eq!(
            task.score_group(&[input("<answer>abc</answer>", "abc")])
                .unwrap(),
            vec![1.0]
        );
        let err = Scorer::new(&parse(r#"{"type": "task"}"#), None, &registry)
            .err()
            .unwrap();
        assert!(err.contains("data.task is not set"), "{err}");
        let err = Scorer::new(
            &parse(r#"{"type": "function", "name": "nope"}"#),
            None,
            &registry,
        )
        .err()
        .unwrap();
        assert!(
            err.contains("registered: addition, arithmetic, countdown, repeat, string"),
            "{err}"
        );
        let bad = serde_json::from_str::<RewardConfig>(r#"{"type": "mystery"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("unknown variant `mystery`, expected one of `task`, `math`"),
            "{bad}"
        );
    }

    #[test]
    fn group_functions_see_the_whole_group() {
        let mut registry = Registry::default();
        // Rank rewards: the shortest response of the group gets 1.
        registry.register_group("shortest", |xs| {
            let min = xs.iter().map(|x| x.response.len()).min().unwrap_or(0);
            xs.iter()
                .map(|x| (x.response.len() == min) as u8 as f64)
                .collect()
        });
        let s = Scorer::new(
            &RewardConfig::GroupFunction {
                name: "shortest".into(),
            },
            None,
            &registry,
        )
        .unwrap();
        assert_eq!(
            s.score_group(&[input("aaa", ""), input("a", ""), input("aa", "")])
                .unwrap(),
            vec![0.0, 1.0, 0.0]
        );
    }

    /// A reward model on a local socket: answers `{"score": len(response)}`, after a 503 for the
    /// very first request (which the client must retry), and 400 for a response of "bad".
    fn serve_reward_model() -> String {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/score", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let mut first = true;
            for stream in listener.incoming() {
                let stream = stream.unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut out = stream;
                loop {
                    let mut length = None;
                    let mut line = String::new();
                    let mut saw_request = false;
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            break;
                        }
                        saw_request = true;
                        if line == "\r\n" {
                            break;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse::<usize>().ok();
                        }
                    }
                    if !saw_request {
                        break;
                    }
                    let mut body = vec![0; length.unwrap_or(0)];
                    reader.read_exact(&mut body).unwrap();
                    let request: Value = serde_json::from_slice(&body).unwrap();
                    let response = request["response"].as_str().unwrap().to_owned();
                    let (status, answer) = if first {
                        first = false;
                        ("503 Service Unavailable", "busy".to_owned())
                    } else if response == "bad" {
                        ("400 Bad Request", "no".to_owned())
                    } else {
                        assert_eq!(request["label"], "L");
                        ("200 OK", json!({"score": response.len()}).to_string())
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    out.write_all(reply.as_bytes()).unwrap();
                }
            }
        });
        url
    }

    #[test]
    fn remote_reward_model_over_http() {
        let url = serve_reward_model();
        let config = RewardConfig::Remote {
            url: url.clone(),
            timeout_secs: 5.0,
            max_retries: 2,
        };
        let scorer = Scorer::new(&config, None, &Registry::default()).unwrap();
        assert!(scorer.blocks());
        let rewards = scorer
            .score_group(&[input("abc", "L"), input("hello", "L")])
            .unwrap();
        assert_eq!(
            rewards,
            vec![3.0, 5.0],
            "the first call was retried after the 503"
        );
        let err = scorer
            .score_group(&[input("bad", "L")])
            .unwrap_err()
            .to_string();
        assert!(err.contains(&url) && err.contains("HTTP 400"), "{err}");
        let bad_url = Scorer::new(
            &RewardConfig::Remote {
                url: "ftp://x".into(),
                timeout_secs: 5.0,
                max_retries: 0,
            },
            None,
            &Registry::default(),
        )
        .err()
        .unwrap();
        assert!(bad_url.contains("reward.url"), "{bad_url}");
    }

    #[test]
    fn remote_answers_parse() {
        assert_eq!(parse_score("0.5").unwrap(), 0.5);
        assert_eq!(parse_score(r#"{"score": 1}"#).unwrap(), 1.0);
        assert_eq!(parse_score(r#"{"reward": -2.5}"#).unwrap(), -2.5);
        assert!(parse_score(r#"{"value": 1}"#)
            .unwrap_err()
            .contains("expected a number"));
        assert!(parse_score("oops").unwrap_err().contains("not JSON"));
    }
}
