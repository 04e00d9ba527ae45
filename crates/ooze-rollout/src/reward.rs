//! Built-in reward functions of a recipe, chosen by name in its TOML: a response and the sample's
//! label in, a score out.
//!
//! - `math`: 1 when the last `\boxed{}` (or the configured answer pattern) is equivalent to the
//!   label ([`crate::math_answer`]), else 0.
//! - `exact_match` / `f1`: SQuAD-normalised QA scores against one label or a JSON list of them.
//! - `regex`: 1 when the response matches the pattern. `contains`: 1 when it contains the label.

use crate::{math_answer, qa};
use regex::Regex;
use serde::{Deserialize, Serialize};

/// A built-in reward, as written in a recipe (`[reward] type = "math"`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RewardSpec {
    Math {
        /// A regex whose last match (first group) is the answer, instead of `\boxed{}`.
        #[serde(default)]
        answer_pattern: Option<String>,
    },
    ExactMatch,
    F1,
    Regex {
        pattern: String,
    },
    Contains,
}

/// A reward spec with its patterns compiled.
#[derive(Debug, Clone)]
pub enum Reward {
    Math { pattern: Option<Regex> },
    ExactMatch,
    F1,
    Regex(Regex),
    Contains,
}

/// A spec the reward cannot be built from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("reward.{field}: {message}")]
pub struct RewardError {
    pub field: &'static str,
    pub message: String,
}

impl RewardSpec {
    pub fn build(&self) -> Result<Reward, RewardError> {
        let compile = |field: &'static str, p: &str| {
            Regex::new(p).map_err(|e| RewardError {
                field,
                message: format!("not a valid regular expression: {e}"),
            })
        };
        Ok(match self {
            RewardSpec::Math { answer_pattern } => Reward::Math {
                pattern: answer_pattern
                    .as_deref()
                    .map(|p| compile("answer_pattern", p))
                    .transpose()?,
            },
            RewardSpec::ExactMatch => Reward::ExactMatch,
            RewardSpec::F1 => Reward::F1,
            RewardSpec::Regex { pattern } => Reward::Regex(compile("pattern", pattern)?),
            RewardSpec::Contains => Reward::Contains,
        })
    }
}

/// The gold answers in a label: a JSON list of strings, or the label itself.
fn golds(label: &str) -> Vec<String> {
    let t = label.trim();
    if t.starts_with('[') {
        if let Ok(list) = serde_json::from_str::<Vec<String>>(t) {
            return list;
        }
    }
    vec![label.to_owned()]
}

impl Reward {
    /// The score of `response` for a sample labelled `label`.
    pub fn score(&self, response: &str, label: &str) -> f64 {
        match self {
            Reward::Math { pattern } => math_answer::extract_answer(response, pattern.as_ref())
                .is_some_and(|answer| math_answer::equivalent(answer, label))
                as u8 as f64,
            Reward::ExactMatch => qa::exact_match(response, &golds(label)),
            Reward::F1 => qa::f1(response, &golds(label)),
            Reward::Regex(re) => re.is_match(response) as u8 as f64,
            Reward::Contains => (!label.is_empty() && response.contains(label)) as u8 as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(toml_like: RewardSpec) -> Reward {
        toml_like.build().unwrap()
    }

    #[test]
    fn each_reward_scores() {
        let math = build(RewardSpec::Math {
            answer_pattern: None,
        });
        assert_eq!(math.score(r"so \boxed{\frac{6}{4}}", "1.5"), 1.0);
        assert_eq!(math.score(r"so \boxed{2}", "1.5"), 0.0);
        assert_eq!(math.score("no box 1.5", "1.5"), 0.0);
        let pattern = build(RewardSpec::Math {
            answer_pattern: Some(r"####\s*(\S+)".into()),
        });
        assert_eq!(pattern.score("work\n#### 1,234", "1234"), 1.0);
        let em = build(RewardSpec::ExactMatch);
        assert_eq!(em.score("The Nile", r#"["nile", "Amazon"]"#), 1.0);
        assert_eq!(em.score("The Nile", "Amazon"), 0.0);
        assert!(build(RewardSpec::F1).score("the river nile", "nile") > 0.6);
        assert_eq!(
            build(RewardSpec::Regex {
                pattern: r"^\d+$".into()
            })
            .score("42", ""),
            1.0
        );
        assert_eq!(build(RewardSpec::Contains).score("it is 42.", "42"), 1.0);
        let err = RewardSpec::Regex {
            pattern: "(".into(),
        }
        .build()
        .unwrap_err();
        assert!(err
            .to_string()
            .starts_with("reward.pattern: not a valid regular expression"));
    }
}
