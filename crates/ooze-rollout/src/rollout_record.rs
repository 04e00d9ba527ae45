//! The line format of saved rollouts (`RUN/rollouts/rollout-NNNNNN.jsonl`): one [`Group`] per line,
//! its prompt once and its samples without the prompt tokens they share with it.
//!
//! In memory a group's samples are [`Sample`]s; on disk each is written under the field names runs
//! have always used (`index`, `sibling`, `prompt_ids`, `loss_mask`, `agent_metrics`, `error`,
//! `response_ids`, `log_probs`, `response`, `finish`, `reward`, `trained`, `seed`,
//! `weight_version`), so a run directory written by an older ooze still replays. Newer fields
//! (`observation_mask`, `weight_versions`, `token_versions`, `session_id`, `metadata`) are written
//! only when they say something (versions: when a partial rollout spans several), and `loss_mask` always (older plain rollouts left it out when every token was the
//! policy's; such a record reads back with an all-ones mask). A sample written with
//! `trained: false` comes back removed (its loss mask zeroed).
//!
//! | field | from the sample |
//! |---|---|
//! | `index`, `sibling` | `execution`, `sibling` (`sibling` omitted when 0) |
//! | `prompt_ids` | its prompt tokens, only when they are not the group's prompt |
//! | `finish` | `status` and `stop` |
//! | `trained` | `!removed` |
//! | `weight_version` | the newest of `weight_versions` |

use crate::manager::Group;
use crate::prompts::PromptItem;
use ooze_core::{FinishReason, Sample, SessionId, Status};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::collections::BTreeMap;

#[derive(Serialize, Deserialize)]
struct Record<'a> {
    group: u64,
    prompt: Cow<'a, PromptItem>,
    samples: Vec<SampleRecord<'a>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SampleRecord<'a> {
    index: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    sibling: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prompt_ids: Option<Cow<'a, [u32]>>,
    #[serde(default)]
    loss_mask: Option<Cow<'a, [u8]>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    agent_metrics: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<Cow<'a, str>>,
    response_ids: Cow<'a, [u32]>,
    log_probs: Cow<'a, [f32]>,
    response: Cow<'a, str>,
    finish: FinishReason,
    reward: f64,
    trained: bool,
    seed: u64,
    weight_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observation_mask: Option<Cow<'a, [u8]>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    weight_versions: Option<Cow<'a, [u64]>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token_versions: Option<Cow<'a, [u64]>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session_id: Option<Cow<'a, SessionId>>,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    metadata: serde_json::Map<String, serde_json::Value>,
}

fn is_zero(x: &usize) -> bool {
    *x == 0
}

impl<'a> SampleRecord<'a> {
    fn of(s: &'a Sample, group_prompt: &[u32]) -> SampleRecord<'a> {
        let own_prompt = s.prompt_tokens();
        SampleRecord {
            index: s.execution,
            sibling: s.sibling,
            prompt_ids: (own_prompt != group_prompt).then_some(Cow::Borrowed(own_prompt)),
            loss_mask: Some(Cow::Borrowed(&s.loss_mask[..])),
            agent_metrics: s.metrics.clone(),
            error: s.error.as_deref().map(Cow::Borrowed),
            response_ids: Cow::Borrowed(s.response_tokens()),
            log_probs: Cow::Borrowed(&s.rollout_log_probs),
            response: Cow::Borrowed(&s.response),
            finish: s.finish_reason(),
            reward: s.reward.unwrap_or(0.0),
            trained: !s.removed,
            seed: s.seed,
            weight_version: s.weight_version(),
            observation_mask: s
                .observation_mask
                .iter()
                .any(|&m| m != 0)
                .then_some(Cow::Borrowed(&s.observation_mask[..])),
            weight_versions: (s.weight_versions.len() > 1)
                .then_some(Cow::Borrowed(&s.weight_versions[..])),
            token_versions: (s.weight_versions.len() > 1 && !s.token_versions.is_empty())
                .then_some(Cow::Borrowed(&s.token_versions[..])),
            session_id: s.session_id.as_ref().map(Cow::Borrowed),
            metadata: s.metadata.clone(),
        }
    }

    fn into_sample(self, group: u64, group_prompt: &[u32]) -> Result<Sample, String> {
        let n = self.response_ids.len();
        let prompt = self.prompt_ids.unwrap_or(Cow::Borrowed(group_prompt));
        let mut sample = Sample {
            group,
            execution: self.index,
            sibling: self.sibling,
            session_id: self.session_id.map(Cow::into_owned),
            tokens: [&prompt[..], &self.response_ids[..]].concat(),
            response_length: n,
            response: self.response.into_owned(),
            loss_mask: self.loss_mask.map_or_else(|| vec![1; n], Cow::into_owned),
            observation_mask: self
                .observation_mask
                .map_or_else(|| vec![0; n], Cow::into_owned),
            rollout_log_probs: self.log_probs.into_owned(),
            weight_versions: self
                .weight_versions
                .map_or_else(|| vec![self.weight_version], Cow::into_owned),
            token_versions: self.token_versions.map(Cow::into_owned).unwrap_or_default(),
            reward: Some(self.reward),
            seed: self.seed,
            metrics: self.agent_metrics,
            metadata: self.metadata,
            ..Sample::default()
        };
        sample.finish(&self.finish);
        if let Some(error) = self.error {
            sample.error = Some(error.into_owned());
            sample.status = Status::Failed;
        }
        if !self.trained {
            sample.remove();
        }
        sample
            .check()
            .map_err(|e| format!("group {group}, execution {}: {e}", self.index))?;
        Ok(sample)
    }
}

impl Serialize for Group {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Record {
            group: self.group,
            prompt: Cow::Borrowed(&self.prompt),
            samples: self
                .samples
                .iter()
                .map(|s| SampleRecord::of(s, &self.prompt.input_ids))
                .collect(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Group {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Group, D::Error> {
        let record = Record::deserialize(deserializer)?;
        let prompt = record.prompt.into_owned();
        let samples = record
            .samples
            .into_iter()
            .map(|s| s.into_sample(record.group, &prompt.input_ids))
            .collect::<Result<_, _>>()
            .map_err(serde::de::Error::custom)?;
        Ok(Group {
            group: record.group,
            prompt,
            samples,
        })
    }
}
