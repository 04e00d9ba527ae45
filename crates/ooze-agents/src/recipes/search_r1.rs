//! Search-R1: the model reasons, searches with `<search>query</search>` and answers with
//! `<answer>…</answer>`, in one assistant turn. Each search's top documents are inserted as
//! `<information>…</information>` (loss mask 0) and the model continues. Generation stops at the
//! closing tags, so nothing the model writes after a tag is ever trained.
//!
//! The reward is left to the recipe's scorer, which sees the content of the last `<answer>` (empty
//! without one): `exact_match` against any gold answer is the paper's reward. With a
//! [`FormatReward`] the agent scores instead, with Search-R1's format-aware variant.

use crate::parse::{last_tag, tag_action};
use crate::search::{format_documents, Searcher};
use ooze_core::FinishReason;
use ooze_rollout::agent::{Agent, AgentContext, AgentError, AgentFuture, AgentOutput};
use ooze_rollout::prompts::PromptItem;
use ooze_rollout::qa::{exact_match, normalize};
use ooze_rollout::reward::golds;
use std::collections::BTreeMap;

/// The agent's settings.
#[derive(Debug, Clone)]
pub struct SearchR1Config {
    /// Model turns (each ends at a search, an answer, or the turn budget).
    pub max_turns: usize,
    /// Documents per search.
    pub topk: usize,
    /// Tokens of retrieved text kept per search.
    pub max_observation_tokens: usize,
    /// Score with the format-aware reward instead of leaving exact match to the scorer.
    pub format_reward: Option<FormatReward>,
}

/// Search-R1's format-aware reward (the paper's variant: structure 0.2, final format 0.1,
/// retrieval 0). See [`FormatReward::score`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FormatReward {
    pub structure: f64,
    pub final_format: f64,
    pub retrieval: f64,
}

impl FormatReward {
    /// The reward of `response` (the model's turns and the inserted information blocks, no
    /// prompt) against `golds`:
    ///
    /// | answer | well-formed | reward |
    /// |---|---|---|
    /// | exact match | yes | 1 |
    /// | exact match | no | 1 − structure |
    /// | wrong or none | yes | structure (+ retrieval if an information block holds a gold answer) |
    /// | wrong | no | final_format |
    /// | none | no | 0 |
    pub fn score(&self, response: &str, golds: &[String]) -> f64 {
        let formed = well_formed(response);
        let answer = last_tag(response, "answer");
        if answer.is_some_and(|a| exact_match(a, golds) == 1.0) {
            return if formed { 1.0 } else { 1.0 - self.structure };
        }
        if formed {
            let found = information_blocks(response).any(|block| {
                let block = normalize(block);
                golds.iter().any(|g| block.contains(&normalize(g)))
            });
            return self.structure + if found { self.retrieval } else { 0.0 };
        }
        if answer.is_some() {
            self.final_format
        } else {
            0.0
        }
    }
}

/// The contents of every `<information>…</information>` block.
fn information_blocks(text: &str) -> impl Iterator<Item = &str> {
    text.split("<information>")
        .skip(1)
        .filter_map(|rest| rest.split_once("</information>").map(|(inside, _)| inside))
}

/// Whether `response` follows Search-R1's action grammar: `<think>…</think>`, then either
/// `<search>…</search>` followed by `<information>…</information>` and another think, or
/// `<answer>…</answer>` to finish; only whitespace between tags; nothing after the answer.
pub fn well_formed(response: &str) -> bool {
    #[derive(PartialEq, Clone, Copy)]
    enum State {
        Start,
        InThink,
        AfterThink,
        InSearch,
        AfterSearch,
        InInformation,
        AfterInformation,
        InAnswer,
        End,
    }
    use State::*;
    const TAGS: [&str; 8] = [
        "<think>",
        "</think>",
        "<search>",
        "</search>",
        "<information>",
        "</information>",
        "<answer>",
        "</answer>",
    ];
    let mut state = Start;
    let mut rest = response;
    loop {
        // The next tag, and the text before it.
        let next = TAGS
            .iter()
            .filter_map(|t| rest.find(t).map(|i| (i, *t)))
            .min_by_key(|(i, _)| *i);
        let (text, tag) = match next {
            Some((i, t)) => (&rest[..i], Some(t)),
            None => (rest, None),
        };
        let inside = matches!(state, InThink | InSearch | InInformation | InAnswer);
        if !inside && !text.trim().is_empty() {
            return false;
        }
        let Some(tag) = tag else {
            return state == End;
        };
        state = match (state, tag) {
            (Start | AfterInformation, "<think>") => InThink,
            (InThink, "</think>") => AfterThink,
            (AfterThink, "<search>") => InSearch,
            (InSearch, "</search>") => AfterSearch,
            (AfterSearch, "<information>") => InInformation,
            (InInformation, "</information>") => AfterInformation,
            (AfterThink, "<answer>") => InAnswer,
            (InAnswer, "</answer>") => End,
            _ => return false,
        };
        rest = &rest[text.len() + tag.len()..];
    }
}

impl Default for SearchR1Config {
    fn default() -> Self {
        SearchR1Config {
            max_turns: 4,
            topk: 3,
            max_observation_tokens: 500,
            format_reward: None,
        }
    }
}

/// The end-of-turn marker of ChatML templates, ignored at the end of a response when judging its
/// format.
const END_OF_TURN: &str = "<|im_end|>";

/// What the model is told after an action it did not write correctly.
pub const INVALID_ACTION: &str = "\n[Invalid action. Put a search query between <search> and </search>, or the final answer between <answer> and </answer>.]\n";

pub struct SearchR1Agent {
    pub searcher: Searcher,
    pub config: SearchR1Config,
}

impl Agent for SearchR1Agent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let mut conv = ctx.start_rendered(prompt);
            let (mut searches, mut invalid, mut turns) = (0.0, 0.0, 0.0);
            for _ in 0..self.config.max_turns {
                let turn = ctx.generate(&mut conv, &["</search>", "</answer>"]).await?;
                turns += 1.0;
                if turn.tokens == 0 || turn.finish == FinishReason::Length {
                    break;
                }
                match tag_action(&turn.text, &["search", "answer"]) {
                    Some(Ok(("answer", _))) => break,
                    Some(Ok((_, query))) => {
                        searches += 1.0;
                        let docs = self
                            .searcher
                            .search(&[query.to_owned()], self.config.topk)
                            .await
                            .map_err(|e| AgentError::Agent(e.to_string()))?;
                        let found = ctx.truncate(
                            &format_documents(&docs[0]),
                            self.config.max_observation_tokens,
                        )?;
                        ctx.append_text(
                            &mut conv,
                            &format!("\n\n<information>{found}</information>\n\n"),
                        )?;
                    }
                    Some(Err(_)) | None => {
                        // The model ended its turn itself without an action: it is done.
                        if matches!(
                            turn.finish,
                            FinishReason::Stop {
                                matched: ooze_core::StopMatch::Token(_)
                            }
                        ) {
                            break;
                        }
                        invalid += 1.0;
                        ctx.append_text(&mut conv, INVALID_ACTION)?;
                    }
                }
            }
            let response = conv.response_text(ctx.tokenizer())?;
            let answer = last_tag(&response, "answer").unwrap_or("").to_owned();
            let mut metrics = BTreeMap::from([
                ("turns".to_string(), turns),
                ("searches".to_string(), searches),
                ("invalid_actions".to_string(), invalid),
                ("answered".to_string(), (!answer.is_empty()) as u8 as f64),
            ]);
            let reward = self.config.format_reward.map(|f| {
                let text = response.trim_end_matches(END_OF_TURN);
                metrics.insert("well_formed".into(), well_formed(text) as u8 as f64);
                f.score(text, &golds(&prompt.label))
            });
            Ok(AgentOutput {
                samples: vec![conv.sample],
                reward,
                final_response: Some(answer),
                metrics,
            })
        })
    }
}

/// The instruction wrapped around each question.
pub fn instruction(question: &str) -> String {
    format!(
        "Answer the question below. Think inside <think> and </think>. To look something up, \
         write <search>your query</search>; the results come back between <information> and \
         </information>. Search as often as you need, then give only the final answer between \
         <answer> and </answer>, for example <answer>Paris</answer>.\nQuestion: {question}"
    )
}

/// A generated Search-R1-style dataset: a corpus of made-up facts (so no model can know them
/// without searching) and questions about them, in Search-R1's row layout.
pub struct Synthetic {
    /// `{"id", "contents": "Title\ntext"}`
    pub corpus: Vec<serde_json::Value>,
    /// `{"id", "question", "golden_answers", "data_source", "prompt": [{role, content}],
    /// "ability", "reward_model": {"style", "ground_truth": {"target": [...]}}, "extra_info"}`
    pub questions: Vec<serde_json::Value>,
}

/// `n` questions (and their facts) from `seed`.
pub fn synthetic(n: usize, seed: u64) -> Synthetic {
    use serde_json::json;
    const RELATIONS: &[(&str, &str, &str)] = &[
        (
            "capital",
            "The capital of {s} is {o}.",
            "What is the capital of {s}?",
        ),
        (
            "river",
            "The longest river of {s} is the {o}.",
            "What is the longest river of {s}?",
        ),
        ("founder", "{s} was founded by {o}.", "Who founded {s}?"),
    ];
    let mut rng = ooze_core::SplitMix64::new(seed ^ 0x5ea2_c4e1);
    let name = |rng: &mut ooze_core::SplitMix64| super::invented_name(rng, 4);
    // Every name is used once, so each question has exactly one fact (and one answer).
    let mut used = std::collections::HashSet::new();
    let mut fresh = |rng: &mut ooze_core::SplitMix64| loop {
        let candidate = name(rng);
        if used.insert(candidate.clone()) {
            return candidate;
        }
    };
    let (mut corpus, mut questions) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (relation, fact, question) = RELATIONS[i % RELATIONS.len()];
        let (subject, object) = (fresh(&mut rng), fresh(&mut rng));
        let text = fact.replace("{s}", &subject).replace("{o}", &object);
        corpus.push(json!({"id": i.to_string(), "contents": format!("\"{subject}\"\n{text}")}));
        let q = question.replace("{s}", &subject);
        questions.push(json!({
            "id": format!("train_{i}"),
            "question": q,
            "golden_answers": [object],
            "data_source": "ooze_synthetic",
            "prompt": [{"role": "user", "content": instruction(&q)}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": [object]}},
            "extra_info": {"split": "train", "index": i, "relation": relation},
        }));
    }
    Synthetic { corpus, questions }
}

/// The demonstrations' teacher ([`ooze_rollout::oracle`]) for [`synthetic`] questions, writing the
/// agent's turns in its own run (so the information blocks are the searcher's real results at the
/// recipe's `topk`). Two habits, fixed per question (a hash of it), so the warm-started policy
/// starts imperfect and RL has the search to find, as Search-R1 learns when to search:
/// - half the questions: think, search for the question's subject, read, answer;
/// - half: think and answer at once, from memory (which knows no made-up fact it was not trained
///   on: right on the held-out questions only by luck).
pub struct SearchR1Oracle {
    golds: Vec<String>,
    searches: bool,
}

/// The subject of a [`synthetic`] question ("What is the capital of Kalomi?" → "Kalomi").
fn subject_of(question: &str) -> &str {
    let q = question.trim().trim_end_matches('?');
    [
        "What is the capital of ",
        "What is the longest river of ",
        "Who founded ",
    ]
    .iter()
    .find_map(|p| q.strip_prefix(p))
    .unwrap_or(q)
}

impl SearchR1Oracle {
    pub fn new(prompt: &PromptItem) -> Result<SearchR1Oracle, AgentError> {
        let golds = golds(&prompt.label);
        if golds.is_empty() {
            return Err(AgentError::Agent(format!(
                "prompt at line {}: search_r1's oracle needs the gold answers (data.label_key)",
                prompt.source_line
            )));
        }
        Ok(SearchR1Oracle {
            golds,
            searches: super::strategy(&prompt.text, 2) == 0,
        })
    }
}

impl ooze_rollout::oracle::Oracle for SearchR1Oracle {
    fn reply(
        &self,
        caller: ooze_rollout::oracle::Caller<'_>,
        messages: &[serde_json::Value],
    ) -> Result<String, String> {
        super::policy_only(caller, "search_r1")?;
        let question = messages
            .iter()
            .rev()
            .filter(|m| m["role"] == "user")
            .find_map(|m| m["content"].as_str()?.rsplit_once("Question: "))
            .map(|(_, q)| q.trim())
            .ok_or("the prompt has no \"Question: \" line")?;
        let searched = messages.last().is_some_and(|m| {
            m["role"] == "assistant" && super::last_text(messages).contains("</information>")
        });
        let answer = &self.golds[0];
        Ok(if searched {
            format!(
                "<think>The information answers \"{question}\"</think>\n<answer>{answer}</answer>"
            )
        } else if self.searches {
            let subject = subject_of(question);
            format!("<think>I need to look up {subject}.</think>\n<search>{subject}</search>")
        } else {
            format!("<think>I know the answer to \"{question}\"</think>\n<answer>{answer}</answer>")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        let good = "<think>a</think>\n<search>q</search>\n\n<information>Doc 1 x</information>\n\n<think>b</think> <answer>Paris</answer>";
        assert!(well_formed(good));
        assert!(well_formed("<think></think><answer>x</answer>"));
        for bad in [
            "<answer>x</answer>",                                   // no think first
            "<think>a</think>so <answer>x</answer>",                // text between tags
            "<think>a</think><answer>x</answer> more",              // text after the answer
            "<think>a</think><search>q</search><answer>x</answer>", // search without results
            "<think>a</think><search>q</search>",                   // no answer
            "<think>a<answer>x</answer></think>",                   // nested
            "",
        ] {
            assert!(!well_formed(bad), "{bad}");
        }
    }

    #[test]
    fn the_four_levels() {
        let f = FormatReward {
            structure: 0.2,
            final_format: 0.1,
            retrieval: 0.0,
        };
        let golds = vec!["Paris".to_string()];
        let formed = |answer: &str| format!("<think>t</think><answer>{answer}</answer>");
        assert_eq!(f.score(&formed("the paris"), &golds), 1.0);
        assert_eq!(f.score(&format!("x {}", formed("Paris")), &golds), 0.8);
        assert_eq!(f.score(&formed("Rome"), &golds), 0.2);
        assert_eq!(f.score(&format!("x {}", formed("Rome")), &golds), 0.1);
        assert_eq!(f.score("no answer at all", &golds), 0.0);
        // Retrieval credit: a well-formed wrong answer whose information held the gold answer.
        let with_retrieval = FormatReward {
            retrieval: 0.1,
            ..f
        };
        let searched = "<think>t</think><search>q</search><information>Doc 1(Title: F) The capital is Paris.</information><think>t</think><answer>Rome</answer>";
        assert!((with_retrieval.score(searched, &golds) - 0.3).abs() < 1e-12);
    }

    #[test]
    fn the_oracle_searches_or_answers_at_once() {
        use ooze_rollout::oracle::{Caller, Oracle};
        let data = synthetic(12, 5);
        let mut habits = [0, 0];
        for row in &data.questions {
            let user = row["prompt"][0].clone();
            let prompt = crate::recipes::test_prompt(
                row["reward_model"]["ground_truth"]["target"].to_string(),
                serde_json::Value::Null,
                vec![user.clone()],
            );
            let o = SearchR1Oracle::new(&prompt).unwrap();
            habits[o.searches as usize] += 1;
            let first = o
                .reply(Caller::Policy, std::slice::from_ref(&user))
                .unwrap();
            let gold = row["golden_answers"][0].as_str().unwrap();
            let question = row["question"].as_str().unwrap();
            if !o.searches {
                assert_eq!(last_tag(&first, "answer"), Some(gold));
                continue;
            }
            assert!(first.ends_with("</search>"));
            let (_, query) = tag_action(&first, &["search", "answer"]).unwrap().unwrap();
            assert!(question.contains(query) && !query.contains(' '), "{query}");
            let shown = format!("{first}\n\n<information>Doc 1 …</information>\n\n");
            let assistant = serde_json::json!({"role": "assistant", "content": shown});
            let last = o.reply(Caller::Policy, &[user, assistant]).unwrap();
            assert!(well_formed(&(shown + &last)), "{last}");
            assert_eq!(last_tag(&last, "answer"), Some(gold));
        }
        assert!(habits[0] > 0 && habits[1] > 0, "{habits:?}");
    }
}
