//! vLLM's API as the router speaks it (`rollout.engine_api = "vllm"`):
//!
//! - generation through the OpenAI-compatible `/v1/completions`: the prompt as token ids, the
//!   sampled ids back (`return_token_ids`) with their log-probs (`logprobs: 0`, the sampled
//!   token's only; `return_tokens_as_token_ids` names them `token_id:N`), and the prompt's
//!   log-probs when asked (`prompt_logprobs: 0`). vLLM reports the raw model's log-probs unless
//!   started with `--logprobs-mode processed_logprobs`, which a temperature other than 1 needs;
//! - new weights through the development endpoint `/collective_rpc` (vLLM started with
//!   `VLLM_SERVER_DEV_MODE=1`): every worker runs `reload_weights` on the directory; then
//!   `/reset_prefix_cache` drops what was cached under the old weights.
//!
//! vLLM's own NCCL weight transfer joins through vLLM's `StatelessProcessGroup` (Python objects
//! over its store), which a trainer outside Python cannot join: with vLLM, weights go by disk.

use ooze_core::{FinishReason, StopMatch};
use ooze_engine::{Output, Request, RequestId};
use serde_json::{json, Value};
use std::path::Path;

/// The `/v1/completions` body of `request`.
pub(crate) fn completion_body(request: &Request, prompt_log_probs_from: Option<usize>) -> Value {
    let s = &request.sampling;
    let mut body = json!({
        "prompt": request.input_ids,
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "logprobs": 0,
        "return_tokens_as_token_ids": true,
        "return_token_ids": true,
        "skip_special_tokens": s.skip_special_tokens,
    });
    if s.top_p < 1.0 {
        body["top_p"] = json!(s.top_p);
    }
    if s.top_k > 0 {
        body["top_k"] = json!(s.top_k);
    }
    if s.min_p > 0.0 {
        body["min_p"] = json!(s.min_p);
    }
    if let Some(seed) = s.seed {
        // vLLM takes a signed 64-bit seed.
        body["seed"] = json!(seed & (i64::MAX as u64));
    }
    if s.min_new_tokens > 0 {
        body["min_tokens"] = json!(s.min_new_tokens);
    }
    if !s.stop_token_ids.is_empty() {
        body["stop_token_ids"] = json!(s.stop_token_ids);
    }
    if !s.stop.is_empty() {
        body["stop"] = json!(s.stop);
    }
    if s.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if prompt_log_probs_from.is_some() {
        body["prompt_logprobs"] = json!(0);
    }
    body
}

/// The `/collective_rpc` body that reloads the weights from `dir`.
pub(crate) fn reload_body(dir: &Path) -> Value {
    json!({
        "method": "reload_weights",
        "kwargs": {"weights_path": dir.display().to_string(), "is_checkpoint_format": true},
    })
}

/// A token named `token_id:N`.
fn token_id(name: &Value) -> Option<u32> {
    name.as_str()?
        .strip_prefix("token_id:")?
        .parse::<u32>()
        .ok()
}

/// The log-prob of `token` at one `prompt_logprobs` position: `{"ID": {"logprob": x, …}}`.
fn prompt_entry(entry: &Value, token: u32) -> Option<f32> {
    Some(entry.get(token.to_string())?.get("logprob")?.as_f64()? as f32)
}

/// The engine output of a `/v1/completions` answer to `request`.
pub(crate) fn parse_completion(
    answer: &Value,
    id: RequestId,
    request: &Request,
    prompt_log_probs_from: Option<usize>,
    seed: u64,
    weight_version: u64,
) -> Result<Output, String> {
    let choice = answer["choices"]
        .get(0)
        .ok_or_else(|| format!("no choices[0] in the answer: {answer}"))?;
    let log_probs: Vec<f32> = choice["logprobs"]["token_logprobs"]
        .as_array()
        .ok_or("choices[0].logprobs.token_logprobs is not a list (was logprobs refused?)")?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| format!("choices[0].logprobs.token_logprobs[{i}] is {v}"))
        })
        .collect::<Result<_, _>>()?;
    let tokens: Vec<u32> = match choice["token_ids"].as_array() {
        Some(ids) => ids
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| format!("choices[0].token_ids[{i}] is {v}"))
            })
            .collect::<Result<_, _>>()?,
        // Older servers: the ids only as `token_id:N` names.
        None => choice["logprobs"]["tokens"]
            .as_array()
            .ok_or("choices[0] has neither token_ids nor logprobs.tokens")?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                token_id(v).ok_or_else(|| {
                    format!("choices[0].logprobs.tokens[{i}] is {v}, not token_id:N")
                })
            })
            .collect::<Result<_, _>>()?,
    };
    if tokens.len() != log_probs.len() {
        return Err(format!(
            "choices[0]: {} token ids but {} log-probs",
            tokens.len(),
            log_probs.len()
        ));
    }
    let finish = match choice["finish_reason"].as_str() {
        Some("length") => FinishReason::Length,
        Some("abort") => FinishReason::Abort,
        Some("stop") => FinishReason::Stop {
            matched: match &choice["stop_reason"] {
                Value::Number(n) => StopMatch::Token(n.as_u64().unwrap_or(0) as u32),
                Value::String(s) => StopMatch::Text(s.clone()),
                // The end-of-sequence token, the last one generated.
                _ => StopMatch::Token(tokens.last().copied().unwrap_or(0)),
            },
        },
        other => {
            return Err(format!(
                "choices[0].finish_reason is {other:?}, not stop, length or abort"
            ))
        }
    };
    let prompt_log_probs = match prompt_log_probs_from {
        None => Vec::new(),
        Some(from) => {
            let entries = choice["prompt_logprobs"]
                .as_array()
                .ok_or("choices[0].prompt_logprobs is missing (prompt_logprobs was asked for)")?;
            let ids = &request.input_ids;
            (from.max(1)..ids.len())
                .map(|i| {
                    entries
                        .get(i)
                        .and_then(|e| prompt_entry(e, ids[i]))
                        .ok_or_else(|| {
                            format!("choices[0].prompt_logprobs[{i}] lacks token {}", ids[i])
                        })
                })
                .collect::<Result<_, _>>()?
        }
    };
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0) as usize;
    Ok(Output {
        id,
        tokens,
        log_probs,
        prompt_log_probs,
        finish,
        prompt_tokens: request.input_ids.len(),
        cached_tokens: cached,
        weight_version,
        token_versions: Vec::new(),
        seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ooze_engine::{Sampling, SamplingParams};

    fn request() -> Request {
        let sampling: Sampling = SamplingParams {
            temperature: Some(0.7),
            max_new_tokens: Some(3),
            seed: Some(u64::MAX),
            top_k: Some(5),
            ..Default::default()
        }
        .validate()
        .unwrap();
        Request {
            input_ids: vec![5, 6, 7],
            sampling,
            session: None,
        }
    }

    #[test]
    fn writes_vllm_completions_and_reads_their_token_ids_and_log_probs() {
        let r = request();
        let body = completion_body(&r, None);
        assert_eq!(body["prompt"], json!([5, 6, 7]));
        assert_eq!(body["logprobs"], json!(0));
        assert_eq!(body["return_token_ids"], json!(true));
        assert_eq!(body["top_k"], json!(5));
        assert_eq!(body["seed"], json!(i64::MAX));
        assert!(body.get("prompt_logprobs").is_none());
        let answer = json!({"choices": [{
            "text": "xy", "token_ids": [9, 2], "finish_reason": "stop", "stop_reason": null,
            "logprobs": {"tokens": ["token_id:9", "token_id:2"], "token_logprobs": [-0.5, -1.25]},
        }], "usage": {"prompt_tokens_details": {"cached_tokens": 2}}});
        let out = parse_completion(&answer, RequestId(4), &r, None, 11, 3).unwrap();
        assert_eq!(
            (out.tokens.clone(), out.log_probs.clone()),
            (vec![9, 2], vec![-0.5, -1.25])
        );
        // Stopped by the end-of-sequence token: the last one.
        assert_eq!(
            out.finish,
            FinishReason::Stop {
                matched: StopMatch::Token(2)
            }
        );
        assert_eq!(
            (out.cached_tokens, out.weight_version, out.seed),
            (2, 3, 11)
        );
        // Without token_ids, the `token_id:N` names give the ids.
        let older = json!({"choices": [{"finish_reason": "length",
            "logprobs": {"tokens": ["token_id:4"], "token_logprobs": [-2.0]}}]});
        let out = parse_completion(&older, RequestId(1), &r, None, 0, 0).unwrap();
        assert_eq!((out.tokens, out.finish), (vec![4], FinishReason::Length));
    }

    #[test]
    fn reads_prompt_log_probs_and_names_what_is_wrong() {
        let r = request();
        assert_eq!(completion_body(&r, Some(1))["prompt_logprobs"], json!(0));
        let answer = json!({"choices": [{"token_ids": [], "finish_reason": "length",
            "logprobs": {"tokens": [], "token_logprobs": []},
            "prompt_logprobs": [null, {"6": {"logprob": -0.25, "rank": 1}}, {"7": {"logprob": -3.0}}],
        }]});
        let out = parse_completion(&answer, RequestId(1), &r, Some(0), 0, 0).unwrap();
        assert_eq!(out.prompt_log_probs, vec![-0.25, -3.0]);
        let out = parse_completion(&answer, RequestId(1), &r, Some(2), 0, 0).unwrap();
        assert_eq!(out.prompt_log_probs, vec![-3.0]);
        let uneven = json!({"choices": [{"token_ids": [1, 2], "finish_reason": "length",
            "logprobs": {"token_logprobs": [-1.0]}}]});
        let e = parse_completion(&uneven, RequestId(1), &r, None, 0, 0).unwrap_err();
        assert!(e.contains("2 token ids but 1 log-probs"), "{e}");
        let no_logprobs = json!({"choices": [{"token_ids": [1], "finish_reason": "stop"}]});
        let e = parse_completion(&no_logprobs, RequestId(1), &r, None, 0, 0).unwrap_err();
        assert!(e.contains("token_logprobs"), "{e}");
        let e =
            parse_completion(&json!({"choices": []}), RequestId(1), &r, None, 0, 0).unwrap_err();
        assert!(e.contains("no choices[0]"), "{e}");
        assert_eq!(
            reload_body(Path::new("/w/step-1"))["kwargs"]["weights_path"],
            json!("/w/step-1")
        );
    }
}
