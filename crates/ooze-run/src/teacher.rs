//! A distillation teacher served over HTTP: any server with SGLang's `/generate` prompt log-probs
//! (`ooze serve`, SGLang). Each sample is sent as its token ids with no new tokens to generate:
//!
//! ```json
//! {"input_ids": [...], "sampling_params": {"max_new_tokens": 0, "temperature": T},
//!  "return_logprob": true, "logprob_start_len": PROMPT_LEN - 1}
//! ```
//!
//! and the answer's `meta_info.input_token_logprobs` — `[logprob, token_id, text]` per position
//! from `logprob_start_len` on, the first entry `null` as SGLang writes it — hold the teacher's
//! log-probs of the response tokens after that first entry. The token ids
//! that come back are checked against those sent, so a server that re-tokenised or shifted the
//! positions is an error, not a silent misalignment. The server must compute the log-probs at the
//! temperature sent (`ooze serve` does; with SGLang use temperature 1 or its temperature-scaled
//! log-probs). Samples go out `concurrency` at a time, each with `timeout_secs`.

use ooze_core::Sample;
use ooze_rollout::http_client::JsonClient;
use ooze_train::{TeacherScorer, TrainError};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

pub struct GenerateEndpoint {
    url: String,
    client: JsonClient,
    concurrency: usize,
}

impl GenerateEndpoint {
    /// A client of `{base_url}/generate` (`base_url` like `http://127.0.0.1:30000`).
    pub fn new(base_url: &str, timeout_secs: f64, concurrency: usize) -> GenerateEndpoint {
        GenerateEndpoint {
            url: format!("{}/generate", base_url.trim_end_matches('/')),
            client: JsonClient::new(Duration::from_secs_f64(timeout_secs)),
            concurrency: concurrency.max(1),
        }
    }

    fn score_one(&self, index: usize, s: &Sample, temperature: f64) -> Result<Vec<f64>, String> {
        let body = json!({
            "input_ids": s.tokens,
            "sampling_params": {"max_new_tokens": 0, "temperature": temperature},
            "return_logprob": true,
            "logprob_start_len": s.prompt_length().saturating_sub(1),
        });
        let answer = self
            .client
            .post(&self.url, None, &body)
            .map_err(|e| format!("sample {index}: {e}"))?;
        parse_input_logprobs(&answer, s.response_tokens())
            .map_err(|e| format!("POST {} (sample {index}): {e}", self.url))
    }
}

/// The log-probs of `response` in an SGLang `/generate` answer (`meta_info.input_token_logprobs`
/// from the prompt's last position, whose entry SGLang leaves `null`, on; one object, or a list
/// with one object).
pub fn parse_input_logprobs(answer: &Value, response: &[u32]) -> Result<Vec<f64>, String> {
    let answer = match answer {
        Value::Array(items) if items.len() == 1 => &items[0],
        other => other,
    };
    let entries = answer["meta_info"]["input_token_logprobs"]
        .as_array()
        .ok_or("the answer has no meta_info.input_token_logprobs list (does the server support return_logprob with logprob_start_len?)")?;
    if entries.len() != response.len() + 1 {
        return Err(format!(
            "meta_info.input_token_logprobs has {} entries for the prompt's last token and {} response tokens",
            entries.len(),
            response.len()
        ));
    }
    entries[1..]
        .iter()
        .zip(response)
        .enumerate()
        .map(|(j, (entry, &token))| {
            let j = j + 1;
            let logprob = entry[0].as_f64().ok_or_else(|| {
                format!("meta_info.input_token_logprobs[{j}][0] is not a number: {entry}")
            })?;
            match entry[1].as_i64() {
                Some(id) if id == i64::from(token) => Ok(logprob),
                _ => Err(format!(
                    "meta_info.input_token_logprobs[{j}] is for token {}, the response has {token} there",
                    entry[1]
                )),
            }
        })
        .collect()
}

impl TeacherScorer for GenerateEndpoint {
    fn response_log_probs(
        &self,
        samples: &[Sample],
        temperature: f64,
    ) -> Result<Vec<Vec<f64>>, TrainError> {
        let next = AtomicUsize::new(0);
        type Scored = Option<Result<Vec<f64>, String>>;
        let results: Mutex<Vec<Scored>> = Mutex::new(vec![None; samples.len()]);
        std::thread::scope(|scope| {
            for _ in 0..self.concurrency.min(samples.len()) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(s) = samples.get(i) else { break };
                    let r = self.score_one(i, s, temperature);
                    let failed = r.is_err();
                    results.lock().expect("invariant: no panics while held")[i] = Some(r);
                    if failed {
                        // The step fails anyway; stop sending the rest.
                        next.store(samples.len(), Ordering::Relaxed);
                    }
                });
            }
        });
        let results = results
            .into_inner()
            .expect("invariant: no panics while held");
        let mut out = Vec::with_capacity(samples.len());
        for r in results {
            match r {
                Some(Ok(lp)) => out.push(lp),
                Some(Err(e)) => return Err(TrainError::Teacher(e)),
                None => {}
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_logprobs_are_checked_against_the_response() {
        let answer = json!({"meta_info": {"input_token_logprobs":
            [[null, 3, null], [-0.5, 7, null], [-1.5, 9, null]]}});
        let want = vec![-0.5, -1.5];
        assert_eq!(parse_input_logprobs(&answer, &[7, 9]).unwrap(), want);
        assert_eq!(
            parse_input_logprobs(&json!([answer.clone()]), &[7, 9]).unwrap(),
            want
        );
        let e = parse_input_logprobs(&answer, &[7, 8]).unwrap_err();
        assert!(e.contains("[2] is for token 9, the response has 8"), "{e}");
        let e = parse_input_logprobs(&answer, &[7]).unwrap_err();
        assert!(
            e.contains("3 entries for the prompt's last token and 1 response tokens"),
            "{e}"
        );
        let e = parse_input_logprobs(&json!({"text": ""}), &[7]).unwrap_err();
        assert!(e.contains("no meta_info.input_token_logprobs"), "{e}");
        let bad =
            json!({"meta_info": {"input_token_logprobs": [[null, 3, null], [null, 7, null]]}});
        assert!(parse_input_logprobs(&bad, &[7])
            .unwrap_err()
            .contains("not a number"));
    }
}
