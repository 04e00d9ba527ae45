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
    let name = |rng: &mut ooze_core::SplitMix64| super::invented_name(rng, 3);
    (0..n)
        .map(|i| {
            let (subject, answer) = (name(&mut rng), name(&mut rng));
            let needle = format!("The code word of {subject} is {answer}.");
            let mut sentences: Vec<String> = Vec::new();
            let mut count = 0;
            while count < words {
                let s = if rng.below(3) == 0 {
                    FILLER[rng.below(FILLER.len() as u64) as usize].to_owned()
                } else {
                    let (other, word) = (name(&mut rng), name(&mut rng));
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

/// SFT demonstrations for a [`synthetic`] row read in `pieces` (the document split the way the
/// agent would): each update keeps the needle once seen, and the answer is boxed.
pub fn demonstrations(row: &Value, pieces: &[&str]) -> Vec<Value> {
    let question = row["question"].as_str().unwrap_or_default();
    let needle = row["extra_info"]["needle"].as_str().unwrap_or_default();
    let answer = row["reward_model"]["ground_truth"][0]
        .as_str()
        .unwrap_or_default();
    let chat = |user: String, assistant: String| json!({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]});
    let mut memory = NO_MEMORY.to_owned();
    let mut out = Vec::new();
    for chunk in pieces {
        let next = if memory == NO_MEMORY && chunk.contains(needle) {
            needle.to_owned()
        } else {
            memory.clone()
        };
        out.push(chat(
            update_instruction(question, &memory, chunk),
            next.clone(),
        ));
        memory = next;
    }
    out.push(chat(
        answer_instruction(question, &memory),
        format!("\\boxed{{{answer}}}"),
    ));
    out
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
                .split(' ')
                .next()
                .unwrap();
            // The subject's fact appears once: no distractor about the same subject.
            assert_eq!(doc.matches(&format!("code word of {subject} ")).count(), 1);
        }
    }

    #[test]
    fn demonstrations_carry_the_needle_to_the_answer() {
        let row = &synthetic(1, 300, 2)[0];
        let doc = row["context"].as_str().unwrap();
        let needle = row["extra_info"]["needle"].as_str().unwrap();
        let (a, b) = doc.split_at(doc.find(needle).unwrap() + needle.len());
        let demos = demonstrations(row, &[a, b]);
        assert_eq!(demos.len(), 3);
        let last = demos[2]["messages"][0]["content"].as_str().unwrap();
        assert!(last.contains(needle));
        let reply = demos[2]["messages"][1]["content"].as_str().unwrap();
        let gold = golds(&row["reward_model"]["ground_truth"].to_string());
        assert_eq!(exact_match(last_boxed(reply).unwrap(), &gold), 1.0);
    }
}
