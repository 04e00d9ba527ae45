//! MemAgent: a long document read chunk by chunk through a fixed-size memory. The memory starts as
//! [`NO_MEMORY`]; for each chunk the policy gets a fresh conversation (question, current memory,
//! the chunk) and writes the new memory, which replaces the old one (at most
//! `agent.max_tokens_per_turn` tokens). A last conversation (question, memory) answers in
//! `\boxed{}`. Every conversation is a sample of its own (its own prompt, all response tokens
//! trained); all are siblings of one execution.
//!
//! The reward comes from the final answer only — exact match (SQuAD-normalised) of the boxed
//! answer against any gold answer — and is broadcast to every conversation. The recipe uses
//! `dr_grpo` (reward − group mean, no std), as the paper does.
//!
//! Rows: the document in the row's `context`, the question in `question` (or `input`, or
//! `extra_info.question`), gold answers as the label; read with `data.metadata_key = "*"`.

use ooze_rollout::agent::{Agent, AgentContext, AgentError, AgentFuture, AgentOutput};
use ooze_rollout::math_answer::last_boxed;
use ooze_rollout::prompts::PromptItem;
use ooze_rollout::qa::exact_match;
use ooze_rollout::reward::golds;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The memory before the first chunk.
pub const NO_MEMORY: &str = "No memory yet.";

#[derive(Debug, Clone)]
pub struct MemAgentConfig {
    /// Document tokens per chunk.
    pub chunk_tokens: usize,
}

impl Default for MemAgentConfig {
    fn default() -> Self {
        MemAgentConfig { chunk_tokens: 5000 }
    }
}

pub struct MemAgent {
    pub config: MemAgentConfig,
}

/// The memory-update prompt.
pub fn update_instruction(question: &str, memory: &str, chunk: &str) -> String {
    format!(
        "You read a long document one section at a time to answer a question, keeping notes in a \
         short memory. Rewrite the memory: keep what helps answer the question, add what this \
         section adds, and drop the rest.\nQuestion: {question}\nMemory: {memory}\nSection:\n\
         {chunk}\nNew memory:"
    )
}

/// The final-answer prompt.
pub fn answer_instruction(question: &str, memory: &str) -> String {
    format!(
        "Answer the question from your memory of a document. Put the answer in \\boxed{{}}.\n\
         Question: {question}\nMemory: {memory}"
    )
}

/// The document and the question of a row's metadata.
fn document_and_question(prompt: &PromptItem) -> Result<(&str, &str), AgentError> {
    let m = &prompt.metadata;
    let fail = |what: &str| {
        AgentError::Agent(format!(
            "prompt at line {}: memagent reads {what} from the row (data.metadata_key = \"*\")",
            prompt.source_line
        ))
    };
    let document = m["context"]
        .as_str()
        .ok_or_else(|| fail("the document as a \"context\" string"))?;
    let question = m["question"]
        .as_str()
        .or_else(|| m["input"].as_str())
        .or_else(|| m["extra_info"]["question"].as_str())
        .ok_or_else(|| {
            fail("the question as \"question\", \"input\" or \"extra_info.question\"")
        })?;
    Ok((document, question))
}

/// `document` cut into pieces of at most `tokens` tokens (at token boundaries).
fn chunks<'d>(
    ctx: &AgentContext,
    document: &'d str,
    tokens: usize,
) -> Result<Vec<&'d str>, AgentError> {
    let encoding = ctx
        .tokenizer()
        .encode_with_offsets(document, false)
        .map_err(|e| AgentError::Tokenizer(e.to_string()))?;
    let n = encoding.ids.len();
    let mut out = Vec::new();
    let mut start = 0usize;
    for first in (tokens..n).step_by(tokens) {
        let end = encoding.offsets[first].0;
        out.push(&document[start..end]);
        start = end;
    }
    out.push(&document[start..]);
    Ok(out)
}

impl Agent for MemAgent {
    fn run<'a>(&'a self, ctx: &'a mut AgentContext, prompt: &'a PromptItem) -> AgentFuture<'a> {
        Box::pin(async move {
            let (document, question) = document_and_question(prompt)?;
            let pieces = chunks(ctx, document, self.config.chunk_tokens)?;
            let mut memory = NO_MEMORY.to_owned();
            let mut samples = Vec::with_capacity(pieces.len() + 1);
            for chunk in &pieces {
                let text = update_instruction(question, &memory, chunk);
                let mut conv = ctx.start(vec![json!({"role": "user", "content": text})], None)?;
                let turn = ctx.generate(&mut conv, &[]).await?;
                memory = turn.text.trim().to_owned();
                samples.push(conv.sample);
                if ctx.should_stop() {
                    break;
                }
            }
            let text = answer_instruction(question, &memory);
            let mut conv = ctx.start(vec![json!({"role": "user", "content": text})], None)?;
            let turn = ctx.generate(&mut conv, &[]).await?;
            samples.push(conv.sample);
            let answer = last_boxed(&turn.text);
            let reward = answer.map_or(0.0, |a| exact_match(a, &golds(&prompt.label)));
            let metrics = BTreeMap::from([
                ("chunks".to_string(), pieces.len() as f64),
                ("answered".to_string(), answer.is_some() as u8 as f64),
                ("correct".to_string(), reward),
            ]);
            Ok(AgentOutput {
                samples,
                reward: Some(reward),
                final_response: Some(turn.text),
                metrics,
            })
        })
    }
}

/// A generated long-document QA set: each document is `words` words of made-up facts of one kind
/// ("The code word of Kalomi is Zelfin.") about many people; the question asks for one of them.
/// Rows: `{"data_source", "prompt": [{role, content}], "context", "question",
/// "reward_model": {"ground_truth": [answer]}, "extra_info": {"index", "needle"}}`.
pub fn synthetic(n: usize, words: usize, seed: u64) -> Vec<Value> {
    const FILLER: &[&str] = &[
        "The weather that year was mild.",
        "Travellers often rested by the old bridge.",
        "Markets opened at dawn and closed at noon.",
        "Nobody remembered who built the tower.",
        "The river froze only once in a century.",
    ];
    let mut rng = ooze_core::SplitMix64::new(seed ^ 0x3e3a_6e47);
    // People have a first and a last name (8,400 of each), so a question (which names the
    // subject) of one document almost never recurs in another: a held-out set stays held out.
    let name = |rng: &mut ooze_core::SplitMix64| super::invented_name(rng, 3);
    let person = |rng: &mut ooze_core::SplitMix64| format!("{} {}", name(rng), name(rng));
    (0..n)
        .map(|i| {
            let (subject, answer) = (person(&mut rng), name(&mut rng));
            let needle = format!("The code word of {subject} is {answer}.");
            let mut sentences: Vec<String> = Vec::new();
            let mut count = 0;
            while count < words {
                let s = if rng.below(3) == 0 {
                    FILLER[rng.below(FILLER.len() as u64) as usize].to_owned()
                } else {
                    let (other, word) = (person(&mut rng), name(&mut rng));
                    if other == subject {
                        continue;
                    }
                    format!("The code word of {other} is {word}.")
                };
                count += s.split_whitespace().count();
                sentences.push(s);
            }
            let at = rng.below(sentences.len() as u64 + 1) as usize;
            sentences.insert(at, needle.clone());
            let question = format!("What is the code word of {subject}?");
            json!({
                "data_source": "ooze_synthetic_memagent",
                "prompt": [{"role": "user", "content": question}],
                "context": sentences.join(" "),
                "question": question,
                "reward_model": {"style": "rule", "ground_truth": [answer]},
                "extra_info": {"index": i, "needle": needle, "words": words},
            })
        })
        .collect()
}

/// The demonstrations' teacher ([`ooze_rollout::oracle`]) for a [`synthetic`] row: it writes
/// every memory update and the answer of the agent's own run, chunks and all. Two memory habits,
/// fixed per question (a hash of it), so the warm-started policy starts imperfect and RL has the
/// better habit to find:
/// - two questions in three: the memory becomes the question's fact once a section holds it, and
///   stays so (the answer is right);
/// - one in three: the memory becomes the last code-word fact of each section that has one,
///   whoever it is about (the answer is usually wrong: only the last fact of the document
///   survives).
///
/// The good habit has the larger share because it is the harder one to learn (finding the
/// question's subject among a section's facts); the policy follows the habits turn by turn, so it
/// still starts well below the ceiling.
///
/// The answer boxes the code word of the memory's fact, so it is learned as reading the memory.
pub struct MemAgentOracle {
    needle: String,
    keeps_the_question: bool,
}

impl MemAgentOracle {
    pub fn new(prompt: &PromptItem) -> Result<MemAgentOracle, AgentError> {
        let (_, question) = document_and_question(prompt)?;
        let needle = prompt.metadata["extra_info"]["needle"]
            .as_str()
            .ok_or_else(|| {
                AgentError::Agent(format!(
                    "prompt at line {}: memagent's oracle reads the fact that answers the \
                     question from extra_info.needle (rows of `ooze recipe-data memagent`)",
                    prompt.source_line
                ))
            })?;
        Ok(MemAgentOracle {
            needle: needle.to_owned(),
            keeps_the_question: super::strategy(question, 3) != 0,
        })
    }

    /// The new memory after reading `section` with `memory`.
    fn update(&self, memory: &str, section: &str) -> String {
        if self.keeps_the_question {
            if section.contains(&self.needle) {
                self.needle.clone()
            } else {
                memory.to_owned()
            }
        } else {
            facts(section)
                .last()
                .map_or(memory.to_owned(), |f| (*f).to_owned())
        }
    }
}

/// The whole "The code word of X is Y." sentences of `text`.
fn facts(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("The code word of ") {
        let Some(end) = rest[at..].find('.') else {
            break;
        };
        let sentence = &rest[at..at + end + 1];
        if sentence.contains(" is ") {
            out.push(sentence);
        }
        rest = &rest[at + end + 1..];
    }
    out
}

impl ooze_rollout::oracle::Oracle for MemAgentOracle {
    fn reply(
        &self,
        caller: ooze_rollout::oracle::Caller<'_>,
        messages: &[Value],
    ) -> Result<String, String> {
        super::policy_only(caller, "memagent")?;
        let asked = super::last_text(messages);
        let memory = asked.split_once("\nMemory: ").map_or("", |(_, rest)| {
            rest.split("\nSection:\n").next().unwrap_or(rest)
        });
        Ok(match asked.split_once("\nSection:\n") {
            Some((_, section)) => {
                let section = section.strip_suffix("\nNew memory:").unwrap_or(section);
                self.update(memory, section)
            }
            None => {
                let word = memory
                    .rsplit_once(" is ")
                    .map_or("unknown", |(_, w)| w.trim_end_matches('.'));
                format!("\\boxed{{{word}}}")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_hold_one_needle_of_their_length() {
        for row in synthetic(5, 400, 9) {
            let doc = row["context"].as_str().unwrap();
            let needle = row["extra_info"]["needle"].as_str().unwrap();
            assert_eq!(doc.matches(needle).count(), 1);
            let words = doc.split_whitespace().count();
            assert!((400..460).contains(&words), "{words}");
            let subject = needle
                .trim_start_matches("The code word of ")
                .split(" is ")
                .next()
                .unwrap();
            assert_eq!(subject.split(' ').count(), 2, "{subject}");
            // The subject's fact appears once: no distractor about the same subject.
            assert_eq!(doc.matches(&format!("code word of {subject} ")).count(), 1);
        }
        // Questions of separate sets almost never coincide (held-out sets stay held out).
        let questions = |rows: Vec<Value>| -> std::collections::HashSet<String> {
            rows.iter()
                .map(|r| r["question"].as_str().unwrap().to_owned())
                .collect()
        };
        let train = questions(synthetic(5000, 50, 1));
        let test = questions(synthetic(500, 50, 2));
        assert!(test.intersection(&train).count() <= 5);
    }

    #[test]
    fn the_oracle_keeps_a_fact_and_answers_from_memory() {
        use ooze_rollout::oracle::{Caller, Oracle};
        let rows = synthetic(8, 300, 2);
        let mut habits = [0, 0];
        for row in &rows {
            let prompt = crate::recipes::test_prompt(
                row["reward_model"]["ground_truth"].to_string(),
                row.clone(),
                Vec::new(),
            );
            let o = MemAgentOracle::new(&prompt).unwrap();
            habits[o.keeps_the_question as usize] += 1;
            let doc = row["context"].as_str().unwrap();
            let question = row["question"].as_str().unwrap();
            let needle = row["extra_info"]["needle"].as_str().unwrap();
            let at = doc.find(needle).unwrap() + needle.len();
            // The needle in the first section, a later fact in the second.
            let (a, b) = doc.split_at(at);
            let ask = |text: String| {
                o.reply(Caller::Policy, &[json!({"role": "user", "content": text})])
                    .unwrap()
            };
            let first = ask(update_instruction(question, NO_MEMORY, a));
            let second = ask(update_instruction(question, &first, b));
            let reply = ask(answer_instruction(question, &second));
            let gold = golds(&prompt.label);
            let right = exact_match(last_boxed(&reply).unwrap(), &gold) == 1.0;
            if o.keeps_the_question {
                assert_eq!(second, needle);
                assert!(right, "{reply}");
            } else {
                assert_eq!(
                    Some(second.as_str()),
                    facts(b).last().copied().or(Some(&first))
                );
                assert_eq!(right, second == needle, "{reply}");
            }
        }
        assert!(habits[0] > 0 && habits[1] > 0, "{habits:?}");
        assert_eq!(
            facts("x. The code word of Ab is Cd. The code word of"),
            vec!["The code word of Ab is Cd."]
        );
    }
}
