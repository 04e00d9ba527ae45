//! [`Sample`]: one trainable sequence, self-describing and checked at every boundary.
//!
//! Layout: `tokens = prompt tokens ++ response tokens`; every per-token field (`loss_mask`,
//! `rollout_log_probs`, `teacher_log_probs`) has exactly `response_length` entries. Tokens the policy
//! generated carry mask 1 and the engine's log-prob; tokens a tool or environment appended carry mask
//! 0 and log-prob 0. [`Sample::check`] enforces the length invariant; the append methods keep it.

use crate::ids::{GroupIndex, RolloutId, SampleIndex, SessionId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a sample is in its life. Engine finish reasons map onto it with [`Status::from_finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Not generated yet (or returned to the buffer to be continued).
    #[default]
    Pending,
    /// The policy stopped by itself (stop token or stop string).
    Completed,
    /// Cut at the length limit.
    Truncated,
    /// Aborted (weight update, deadline, user request); may be continued later.
    Aborted,
    /// Something outside the policy failed (tool crash, sandbox error); not trainable as is.
    Failed,
}

/// Why the engine stopped generating one sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token or stop string was produced.
    Stop { matched: StopMatch },
    /// `max_new_tokens` (or the context limit) was reached.
    Length,
    /// The request was aborted before finishing.
    Abort,
}

/// What ended a sequence that stopped by itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopMatch {
    /// A stop token id (EOS or one of `stop_token_ids`).
    Token(u32),
    /// A stop string; it stays in the output.
    Text(String),
}

impl Status {
    /// The status a finished generation leaves a sample in: stop → completed, length → truncated,
    /// abort → aborted.
    pub fn from_finish(reason: &FinishReason) -> Status {
        match reason {
            FinishReason::Stop { .. } => Status::Completed,
            FinishReason::Length => Status::Truncated,
            FinishReason::Abort => Status::Aborted,
        }
    }
}

/// A reward: one number, or named components of which one is chosen as the training scalar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Reward {
    Scalar(f64),
    Named(BTreeMap<String, f64>),
}

impl Reward {
    /// The training scalar. A named reward needs `key`; a scalar ignores it.
    pub fn scalar(&self, key: Option<&str>) -> Result<f64, SampleError> {
        match (self, key) {
            (Reward::Scalar(value), _) => Ok(*value),
            (Reward::Named(map), Some(key)) => {
                map.get(key)
                    .copied()
                    .ok_or_else(|| SampleError::MissingRewardKey {
                        key: key.to_owned(),
                        available: map.keys().cloned().collect(),
                    })
            }
            (Reward::Named(map), None) => Err(SampleError::RewardKeyNeeded {
                available: map.keys().cloned().collect(),
            }),
        }
    }
}

/// The prompt as the data source gave it: plain text or chat messages (kept as JSON so any message
/// shape a chat template understands survives the round trip).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Messages(Vec<serde_json::Value>),
}

impl Default for Prompt {
    fn default() -> Self {
        Prompt::Text(String::new())
    }
}

/// One trainable sequence. See the module docs for the layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Sample {
    /// Prompt group (the `n` samples of one prompt share it).
    pub group_index: GroupIndex,
    /// Global index of this sample.
    pub index: SampleIndex,
    /// Execution this sample was cut from; siblings share it.
    pub rollout_id: RolloutId,
    /// Multi-turn routing key, if the sample came from a session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    pub prompt: Prompt,
    /// Prompt tokens followed by response tokens.
    pub tokens: Vec<u32>,
    /// Decoded response text (for rewards and people; never re-tokenised).
    #[serde(default)]
    pub response: String,
    /// Number of trailing entries of `tokens` that are the response.
    pub response_length: usize,
    /// Ground truth for the reward function, in whatever shape the dataset gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<Reward>,
    /// 1 = generated by the policy and trained; 0 = tool/environment/template token.
    pub loss_mask: Vec<u8>,
    /// Engine log-probs, `log_softmax(logits / T)` at each response token (0 where mask is 0).
    pub rollout_log_probs: Vec<f32>,
    /// Teacher log-probs for on-policy distillation, one per response token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher_log_probs: Option<Vec<f32>>,
    /// Weight versions of the policy that generated the response (more than one after a partial
    /// rollout continued under new weights).
    #[serde(default)]
    pub weight_versions: Vec<u64>,
    /// Zero the loss mask of this sample without removing it from its group.
    #[serde(default)]
    pub remove_sample: bool,
    #[serde(default)]
    pub status: Status,
    /// Prompt tokens served from the engine's prefix cache, summed over the sample's turns.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Named durations in seconds (generation, tool calls, reward).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub timings: BTreeMap<String, f64>,
    /// Free-form data for user code.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// A sample that breaks its own invariants.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SampleError {
    #[error("sample {index}: `{field}` has {actual} entries but response_length is {expected}")]
    LengthMismatch {
        index: SampleIndex,
        field: &'static str,
        actual: usize,
        expected: usize,
    },
    #[error("sample {index}: response_length {response_length} exceeds the {tokens} tokens")]
    ResponseLongerThanTokens {
        index: SampleIndex,
        response_length: usize,
        tokens: usize,
    },
    #[error("sample {index}: loss_mask entry {position} is {value}; expected 0 or 1")]
    BadMask {
        index: SampleIndex,
        position: usize,
        value: u8,
    },
    #[error("{tokens} generated tokens were appended with {log_probs} log-probs; they must match")]
    AppendMismatch { tokens: usize, log_probs: usize },
    #[error("reward has no component `{key}`; available: {available:?}")]
    MissingRewardKey { key: String, available: Vec<String> },
    #[error("reward is a named map; choose the training scalar with a reward key (available: {available:?})")]
    RewardKeyNeeded { available: Vec<String> },
}

impl Sample {
    /// Number of prompt tokens.
    pub fn prompt_length(&self) -> usize {
        self.tokens.len().saturating_sub(self.response_length)
    }

    /// The response tokens.
    pub fn response_tokens(&self) -> &[u32] {
        &self.tokens[self.prompt_length()..]
    }

    /// Checks the length invariant: mask, rollout log-probs and teacher log-probs all have
    /// `response_length` entries, the response fits in `tokens`, and the mask is 0/1.
    pub fn check(&self) -> Result<(), SampleError> {
        if self.response_length > self.tokens.len() {
            return Err(SampleError::ResponseLongerThanTokens {
                index: self.index.clone(),
                response_length: self.response_length,
                tokens: self.tokens.len(),
            });
        }
        let mut per_token: Vec<(&'static str, usize)> = vec![
            ("loss_mask", self.loss_mask.len()),
            ("rollout_log_probs", self.rollout_log_probs.len()),
        ];
        if let Some(teacher) = &self.teacher_log_probs {
            per_token.push(("teacher_log_probs", teacher.len()));
        }
        for (field, actual) in per_token {
            if actual != self.response_length {
                return Err(SampleError::LengthMismatch {
                    index: self.index.clone(),
                    field,
                    actual,
                    expected: self.response_length,
                });
            }
        }
        if let Some((position, &value)) = self.loss_mask.iter().enumerate().find(|(_, &m)| m > 1) {
            return Err(SampleError::BadMask {
                index: self.index.clone(),
                position,
                value,
            });
        }
        Ok(())
    }

    /// Appends tokens the policy generated, with their engine log-probs; they are trained (mask 1).
    pub fn push_generated(&mut self, tokens: &[u32], log_probs: &[f32]) -> Result<(), SampleError> {
        if tokens.len() != log_probs.len() {
            return Err(SampleError::AppendMismatch {
                tokens: tokens.len(),
                log_probs: log_probs.len(),
            });
        }
        self.tokens.extend_from_slice(tokens);
        self.loss_mask.extend(std::iter::repeat_n(1, tokens.len()));
        self.rollout_log_probs.extend_from_slice(log_probs);
        self.response_length += tokens.len();
        Ok(())
    }

    /// Appends tokens a tool or the environment produced; they are context, not trained (mask 0).
    pub fn push_environment(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        self.loss_mask.extend(std::iter::repeat_n(0, tokens.len()));
        self.rollout_log_probs
            .extend(std::iter::repeat_n(0.0, tokens.len()));
        self.response_length += tokens.len();
    }

    /// Sets the status from an engine finish reason.
    pub fn finish(&mut self, reason: &FinishReason) {
        self.status = Status::from_finish(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Sample {
        Sample {
            group_index: GroupIndex(3),
            index: SampleIndex(17),
            rollout_id: RolloutId(9),
            session_id: Some(SessionId("s-1".into())),
            prompt: Prompt::Messages(vec![serde_json::json!({"role": "user", "content": "2+2?"})]),
            tokens: vec![1, 2, 3],
            label: Some(serde_json::json!("4")),
            ..Sample::default()
        }
    }

    #[test]
    fn appends_keep_lengths_in_step() {
        let mut s = sample();
        s.push_generated(&[10, 11], &[-0.5, -1.25]).unwrap();
        s.push_environment(&[20, 21, 22]);
        s.push_generated(&[12], &[-0.1]).unwrap();
        s.check().unwrap();
        assert_eq!(s.response_length, 6);
        assert_eq!(s.prompt_length(), 3);
        assert_eq!(s.response_tokens(), &[10, 11, 20, 21, 22, 12]);
        assert_eq!(s.loss_mask, vec![1, 1, 0, 0, 0, 1]);
        assert_eq!(s.rollout_log_probs, vec![-0.5, -1.25, 0.0, 0.0, 0.0, -0.1]);
    }

    #[test]
    fn append_rejects_unpaired_log_probs() {
        let mut s = sample();
        let err = s.push_generated(&[10, 11], &[-0.5]).unwrap_err();
        assert_eq!(
            err,
            SampleError::AppendMismatch {
                tokens: 2,
                log_probs: 1
            }
        );
        assert_eq!(s.response_length, 0, "a rejected append changes nothing");
    }

    #[test]
    fn check_names_the_field_that_disagrees() {
        let mut s = sample();
        s.push_generated(&[10, 11], &[-0.5, -1.0]).unwrap();
        s.rollout_log_probs.pop();
        let err = s.check().unwrap_err();
        assert_eq!(
            err.to_string(),
            "sample 17: `rollout_log_probs` has 1 entries but response_length is 2"
        );
        let mut s = sample();
        s.response_length = 4;
        assert!(matches!(
            s.check(),
            Err(SampleError::ResponseLongerThanTokens { .. })
        ));
        let mut s = sample();
        s.push_generated(&[10], &[-0.5]).unwrap();
        s.teacher_log_probs = Some(vec![]);
        assert!(matches!(
            s.check(),
            Err(SampleError::LengthMismatch {
                field: "teacher_log_probs",
                ..
            })
        ));
        s.teacher_log_probs = None;
        s.loss_mask[0] = 2;
        assert!(matches!(
            s.check(),
            Err(SampleError::BadMask {
                position: 0,
                value: 2,
                ..
            })
        ));
    }

    #[test]
    fn json_round_trip_keeps_every_field() {
        let mut s = sample();
        s.push_generated(&[10], &[-0.5]).unwrap();
        s.reward = Some(Reward::Named(BTreeMap::from([
            ("acc".into(), 1.0),
            ("fmt".into(), 0.5),
        ])));
        s.teacher_log_probs = Some(vec![-0.25]);
        s.weight_versions = vec![4, 5];
        s.finish(&FinishReason::Stop {
            matched: StopMatch::Token(151645),
        });
        s.cached_tokens = 12;
        s.timings.insert("generate".into(), 0.75);
        s.metadata
            .insert("source".into(), serde_json::json!("gsm8k"));
        let text = serde_json::to_string(&s).unwrap();
        let back: Sample = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.status, Status::Completed);
        let scalar: Sample =
            serde_json::from_str(&text.replace(r#"{"acc":1.0,"fmt":0.5}"#, "0.25")).unwrap();
        assert_eq!(scalar.reward, Some(Reward::Scalar(0.25)));
    }

    #[test]
    fn unknown_json_fields_are_rejected() {
        let text = serde_json::to_string(&sample())
            .unwrap()
            .replacen('{', r#"{"rewrad":1,"#, 1);
        let err = serde_json::from_str::<Sample>(&text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `rewrad`"), "{err}");
    }

    #[test]
    fn reward_scalar_selection() {
        let named = Reward::Named(BTreeMap::from([("acc".into(), 1.0)]));
        assert_eq!(named.scalar(Some("acc")), Ok(1.0));
        assert!(matches!(
            named.scalar(Some("len")),
            Err(SampleError::MissingRewardKey { .. })
        ));
        assert!(matches!(
            named.scalar(None),
            Err(SampleError::RewardKeyNeeded { .. })
        ));
        assert_eq!(Reward::Scalar(-1.0).scalar(Some("acc")), Ok(-1.0));
    }

    #[test]
    fn finish_reasons_map_to_statuses() {
        let stop = FinishReason::Stop {
            matched: StopMatch::Text("</answer>".into()),
        };
        assert_eq!(Status::from_finish(&stop), Status::Completed);
        assert_eq!(
            Status::from_finish(&FinishReason::Length),
            Status::Truncated
        );
        assert_eq!(Status::from_finish(&FinishReason::Abort), Status::Aborted);
    }
}
