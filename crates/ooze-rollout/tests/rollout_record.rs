//! Saved rollouts: a file written by an older ooze (`tests/data/rollout-v1.jsonl`, field names
//! of the first rollout format) reads into the one sample type and writes back the same record
//! (with the loss mask spelled out where the old plain records left it implicit).

use ooze_core::{FinishReason, Status, StopMatch};
use ooze_rollout::manager::Group;
use serde_json::Value;

fn lines() -> Vec<&'static str> {
    include_str!("data/rollout-v1.jsonl").lines().collect()
}

#[test]
fn old_rollout_files_read_and_write_back_unchanged() {
    for (i, line) in lines().into_iter().enumerate() {
        let group: Group =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
        // Compared as JSON values: the numbers as written (f32 log-probs at their shortest).
        let text = serde_json::to_string(&group).unwrap();
        let written: Value = serde_json::from_str(&text).unwrap();
        let mut original: Value = serde_json::from_str(line).unwrap();
        for s in original["samples"].as_array_mut().unwrap() {
            if s.get("loss_mask").is_none() {
                let n = s["response_ids"].as_array().unwrap().len();
                let m = u8::from(s["trained"] == true);
                s["loss_mask"] = serde_json::json!(vec![m; n]);
            }
        }
        assert_eq!(written, original, "line {}", i + 1);
        let again: Group = serde_json::from_str(&text).unwrap();
        assert_eq!(again, group, "line {}", i + 1);
    }
}

#[test]
fn plain_samples_carry_the_prompt_and_the_masked_truncation() {
    let group: Group = serde_json::from_str(lines()[0]).unwrap();
    let [kept, masked] = &group.samples[..] else {
        panic!("two samples");
    };
    assert_eq!(kept.group, 176);
    assert_eq!(kept.prompt_tokens(), &group.prompt.input_ids[..]);
    assert_eq!(kept.response_tokens().len(), 15);
    assert_eq!(kept.loss_mask, vec![1; 15]);
    assert_eq!(kept.rollout_log_probs.len(), 15);
    assert_eq!(kept.reward, Some(1.0));
    assert_eq!(kept.weight_versions, vec![11]);
    assert_eq!(
        kept.finish_reason(),
        FinishReason::Stop {
            matched: StopMatch::Token(679)
        }
    );
    assert!(masked.truncated() && masked.removed);
    assert_eq!(
        masked.loss_mask,
        vec![0; 15],
        "a removed sample trains nothing"
    );
}

#[test]
fn agent_samples_keep_siblings_masks_metrics_and_failures() {
    let group: Group = serde_json::from_str(lines()[1]).unwrap();
    let [first, sibling, failed] = &group.samples[..] else {
        panic!("three samples");
    };
    assert_eq!(first.prompt_tokens(), &[1, 2, 3], "its own prompt");
    assert_eq!(first.loss_mask, vec![1, 1, 0, 0, 1]);
    assert_eq!(first.metrics["tool_calls"], 1.0);
    assert_eq!((sibling.execution, sibling.sibling), (0, 1));
    assert_eq!(sibling.prompt_tokens(), &group.prompt.input_ids[..]);
    assert!(sibling.metrics.is_empty());
    assert_eq!(failed.status, Status::Failed);
    assert!(failed.error.as_deref().unwrap().contains("deadline"));
    assert!(failed.removed && failed.response_length == 0);
    assert_eq!(group.rewards(), vec![0.75, 0.0]);
}

#[test]
fn a_broken_record_names_the_field() {
    let line = lines()[1].replace(r#""loss_mask":[1,0,1]"#, r#""loss_mask":[1,0]"#);
    let err = serde_json::from_str::<Group>(&line)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`loss_mask` has 2 entries but response_length is 3"),
        "{err}"
    );
    let line = lines()[0].replacen(r#""trained""#, r#""trainde""#, 1);
    let err = serde_json::from_str::<Group>(&line)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `trainde`"), "{err}");
}
