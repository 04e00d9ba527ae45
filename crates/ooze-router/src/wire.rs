//! SGLang's native `/generate` in the form external engines speak it (SGLang's own server and
//! `ooze serve`): token ids in, token ids with their log-probs out.

use ooze_core::{FinishReason, StopMatch};
use ooze_engine::{Output, Request, RequestId};
use serde_json::{json, Value};

/// The `/generate` body of `request` under request id `rid`: log-probs of the output (and of the
/// prompt from `prompt_log_probs_from` on, when asked).
pub(crate) fn generate_body(
    request: &Request,
    rid: &str,
    prompt_log_probs_from: Option<usize>,
) -> Value {
    let s = &request.sampling;
    let mut params = json!({
        "max_new_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "skip_special_tokens": s.skip_special_tokens,
    });
    // Only what differs from SGLang's defaults (its top_k "off" is -1, ooze's 0).
    if s.top_p < 1.0 {
        params["top_p"] = json!(s.top_p);
    }
    if s.top_k > 0 {
        params["top_k"] = json!(s.top_k);
    }
    if s.min_p > 0.0 {
        params["min_p"] = json!(s.min_p);
    }
    if let Some(seed) = s.seed {
        params["sampling_seed"] = json!(seed);
    }
    if s.min_new_tokens > 0 {
        params["min_new_tokens"] = json!(s.min_new_tokens);
    }
    if !s.stop_token_ids.is_empty() {
        params["stop_token_ids"] = json!(s.stop_token_ids);
    }
    if !s.stop.is_empty() {
        params["stop"] = json!(s.stop);
    }
    if s.ignore_eos {
        params["ignore_eos"] = json!(true);
    }
    json!({
        "input_ids": request.input_ids,
        "sampling_params": params,
        "return_logprob": true,
        "logprob_start_len": prompt_log_probs_from.map_or(-1, |f| f as i64),
        "rid": rid,
    })
}

/// The `[logprob, token_id, text]` entries of a log-prob list (entries without a log-prob, as
/// the first prompt position has, are left out).
fn entries(list: &Value, what: &str) -> Result<Vec<(f32, u32)>, String> {
    let Some(items) = list.as_array() else {
        return Err(format!("meta_info.{what} is not a list"));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let bad = || format!("meta_info.{what}[{i}] is not [logprob, token_id, text]: {item}");
        let lp = item.get(0).ok_or_else(bad)?;
        if lp.is_null() {
            continue;
        }
        let lp = lp.as_f64().ok_or_else(bad)? as f32;
        let id = item.get(1).and_then(Value::as_u64).ok_or_else(bad)?;
        out.push((lp, u32::try_from(id).map_err(|_| bad())?));
    }
    Ok(out)
}

fn finish(meta: &Value) -> Result<FinishReason, String> {
    let reason = &meta["finish_reason"];
    match reason["type"].as_str() {
        Some("length") => Ok(FinishReason::Length),
        Some("abort") => Ok(FinishReason::Abort),
        Some("stop") => Ok(FinishReason::Stop {
            matched: match &reason["matched"] {
                Value::Number(n) => StopMatch::Token(n.as_u64().unwrap_or(0) as u32),
                Value::String(s) => StopMatch::Text(s.clone()),
                _ => StopMatch::Token(0),
            },
        }),
        _ => Err(format!(
            "meta_info.finish_reason is not one of stop, length, abort: {reason}"
        )),
    }
}

/// The engine output of a `/generate` answer.
pub(crate) fn parse_output(
    answer: &Value,
    id: RequestId,
    prompt: usize,
    seed: u64,
    weight_version: u64,
) -> Result<Output, String> {
    let meta = &answer["meta_info"];
    let generated = entries(&meta["output_token_logprobs"], "output_token_logprobs")?;
    let tokens: Vec<u32> = generated.iter().map(|e| e.1).collect();
    if let Some(ids) = answer["output_ids"].as_array() {
        let ids: Vec<u64> = ids.iter().filter_map(Value::as_u64).collect();
        if ids.len() != tokens.len() || ids.iter().zip(&tokens).any(|(a, &b)| *a != b as u64) {
            return Err(format!(
                "output_ids ({} tokens) and meta_info.output_token_logprobs ({} entries) disagree",
                ids.len(),
                tokens.len()
            ));
        }
    }
    let prompt_log_probs = if meta.get("input_token_logprobs").is_some() {
        entries(&meta["input_token_logprobs"], "input_token_logprobs")?
            .into_iter()
            .map(|e| e.0)
            .collect()
    } else {
        Vec::new()
    };
    Ok(Output {
        id,
        log_probs: generated.iter().map(|e| e.0).collect(),
        tokens,
        prompt_log_probs,
        finish: finish(meta)?,
        prompt_tokens: prompt,
        cached_tokens: meta["cached_tokens"].as_u64().unwrap_or(0) as usize,
        weight_version,
        token_versions: Vec::new(),
        seed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ooze_engine::{Sampling, SamplingParams};

    #[test]
    fn writes_sglang_sampling_and_reads_its_answer() {
        let sampling: Sampling = SamplingParams {
            temperature: Some(0.7),
            max_new_tokens: Some(3),
            seed: Some(11),
            stop: Some(ooze_engine::StopStrings::One("END".into())),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let request = Request {
            input_ids: vec![5, 6, 7],
            sampling,
            session: None,
        };
        let body = generate_body(&request, "r1", None);
        assert_eq!(body["input_ids"], json!([5, 6, 7]));
        assert_eq!(body["sampling_params"]["sampling_seed"], json!(11));
        assert_eq!(body["sampling_params"]["stop"], json!(["END"]));
        assert!(body["sampling_params"].get("top_k").is_none());
        assert_eq!(body["logprob_start_len"], json!(-1));
        let answer = json!({
            "text": "abc",
            "output_ids": [9, 10],
            "meta_info": {
                "finish_reason": {"type": "stop", "matched": 10},
                "cached_tokens": 2,
                "output_token_logprobs": [[-0.5, 9, null], [-1.25, 10, null]],
            }
        });
        let out = parse_output(&answer, RequestId(4), 3, 11, 2).unwrap();
        assert_eq!(out.tokens, vec![9, 10]);
        assert_eq!(out.log_probs, vec![-0.5, -1.25]);
        assert_eq!(
            out.finish,
            FinishReason::Stop {
                matched: StopMatch::Token(10)
            }
        );
        assert_eq!((out.cached_tokens, out.weight_version), (2, 2));
        let broken = json!({"output_ids": [9], "meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.5, 8, null]]}});
        assert!(parse_output(&broken, RequestId(1), 3, 0, 0)
            .unwrap_err()
            .contains("disagree"));
    }
}
