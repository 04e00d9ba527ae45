//! Built-in reward functions of a recipe, chosen by name in its TOML: a response and the sample's
//! label in, a score out.
//!
//! - `math`: 1 when the last `\boxed{}` (or the configured answer pattern) is equivalent to the
//!   label ([`crate::math_answer`]), else 0.
//! - `exact_match` / `f1`: SQuAD-normalised QA scores against one label or a JSON list of them.
//! - `regex`: 1 when the response matches the pattern. `contains`: 1 when it contains the label.

use crate::{math_answer, qa};
use regex::Regex;

/// A built-in reward with its patterns compiled (a recipe names it in `[reward]`, see
/// [`crate::scorer::RewardConfig`]).
#[derive(Debug, Clone)]
pub enum Reward {
    Math { pattern: Option<Regex> },
    ExactMatch,
    F1,
    Regex(Regex),
    Contains,
}

/// A pattern the reward cannot be built from.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("reward.{field}: {message}")]
pub struct RewardError {
    pub field: &'static str,
    pub message: String,
}

fn compile(field: &'static str, pattern: &str) -> Result<Regex, RewardError> {
    Regex::new(pattern).map_err(|e| RewardError {
        field,
        message: format!("not a valid regular expression: {e}"),
    })
}

impl Reward {
    /// `math`, with an optional answer pattern (`reward.answer_pattern`).
    pub fn math(answer_pattern: Option<&str>) -> Result<Reward, RewardError> {
        Ok(Reward::Math {
            pattern: answer_pattern
                .map(|p| compile("answer_pattern", p))
                .transpose()?,
        })
    }

    /// `regex` with `reward.pattern`.
    pub fn regex(pattern: &str) -> Result<Reward, RewardError> {
        compile("pattern", pattern).map(Reward::Regex)
    }
}

/// The gold answers in a label: a JSON list of strings, or the label itself.
pub fn golds(label: &str) -> Vec<String> {
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

    #[test]
    fn each_reward_scores() {
        let math = Reward::math(None).unwrap();
        assert_eq!(math.score(r"so \boxed{\frac{6}{4}}", "1.5"), 1.0);
        assert_eq!(math.score(r"so \boxed{2}", "1.5"), 0.0);
        assert_eq!(math.score("no box 1.5", "1.5"), 0.0);
        let pattern = Reward::math(Some(r"####\s*(\S+)")).unwrap();
        assert_eq!(pattern.score("work\n#### 1,234", "1234"), 1.0);
        let em = Reward::ExactMatch;
        assert_eq!(em.score("The Nile", r#"["nile", "Amazon"]"#), 1.0);
        assert_eq!(em.score("The Nile", "Amazon"), 0.0);
        assert!(Reward::F1.score("the river nile", "nile") > 0.6);
        assert_eq!(Reward::regex(r"^\d+$").unwrap().score("42", ""), 1.0);
        assert_eq!(Reward::Contains.score("it is 42.", "42"), 1.0);
        let err = Reward::regex("(").unwrap_err();
        assert!(err
            .to_string()
            .starts_with("reward.pattern: not a valid regular expression"));
    }
}
