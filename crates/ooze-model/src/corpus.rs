//! A generated English-and-arithmetic text corpus, so a tokenizer can be trained with no download.
//!
//! Deterministic for a seed: word problems with worked answers, tool-call style JSON, short
//! dialogue lines and code-like text — the shapes of text the recipes' agents read and write.

const SUBJECTS: &[&str] = &[
    "Alice",
    "Bob",
    "the farmer",
    "a student",
    "the robot",
    "Maria",
    "the team",
    "my friend",
    "the agent",
    "a baker",
];
const OBJECTS: &[&str] = &[
    "apples", "books", "coins", "marbles", "tickets", "boxes", "cookies", "pencils", "files",
    "stones",
];
const VERBS: &[&str] = &[
    "buys",
    "finds",
    "gives away",
    "sells",
    "collects",
    "loses",
    "counts",
    "packs",
    "keeps",
    "shares",
];
const WORDS: &[&str] = &[
    "the",
    "a",
    "and",
    "of",
    "to",
    "in",
    "is",
    "that",
    "it",
    "for",
    "on",
    "with",
    "as",
    "was",
    "this",
    "by",
    "from",
    "we",
    "can",
    "will",
    "search",
    "answer",
    "question",
    "result",
    "tool",
    "call",
    "python",
    "code",
    "test",
    "file",
    "run",
    "error",
    "value",
    "number",
    "list",
    "think",
    "step",
    "first",
    "then",
    "finally",
    "because",
    "therefore",
    "check",
    "reward",
    "model",
    "train",
    "policy",
    "token",
    "sample",
    "environment",
    "terminal",
    "command",
    "output",
    "input",
    "function",
    "return",
    "print",
    "sum",
    "total",
    "each",
    "every",
    "more",
    "less",
];
const TOOLS: &[&str] = &[
    "search",
    "python",
    "calculator",
    "read_file",
    "run_tests",
    "get_weather",
    "lookup_order",
];

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// About `approx_bytes` of text, one document per line.
pub fn generate(seed: u64, approx_bytes: usize) -> String {
    let mut rng = Lcg(seed ^ 0x5eed_0000_0000_0001);
    let mut out = String::with_capacity(approx_bytes + 256);
    while out.len() < approx_bytes {
        match rng.below(4) {
            0 => {
                let (a, b) = (rng.below(90) + 10, rng.below(50) + 1);
                let (s, o) = (rng.pick(SUBJECTS), rng.pick(OBJECTS));
                out.push_str(&format!(
                    "Question: {s} has {a} {o} and {} {b} more. How many {o} are there now? Let me think step by step. {a} + {b} = {}. The answer is \\boxed{{{}}}.\n",
                    rng.pick(VERBS), a + b, a + b
                ));
            }
            1 => {
                let tool = rng.pick(TOOLS);
                let q = (0..3)
                    .map(|_| rng.pick(WORDS))
                    .collect::<Vec<_>>()
                    .join(" ");
                out.push_str(&format!("<tool_call>\n{{\"name\": \"{tool}\", \"arguments\": {{\"query\": \"{q}\", \"limit\": {}}}}}\n</tool_call>\n", rng.below(10) + 1));
            }
            2 => {
                let n = rng.below(12) + 6;
                let mut line: Vec<&str> = (0..n).map(|_| rng.pick(WORDS)).collect();
                line[0] = rng.pick(SUBJECTS);
                out.push_str(&line.join(" "));
                out.push_str(".\n");
            }
            _ => {
                let (x, y) = (rng.below(100), rng.below(100));
                out.push_str(&format!(
                    "def f(x):\n    return x * {x} + {y}\n\nprint(f({}))  # {}\n",
                    rng.below(9),
                    x * 3 + y
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn deterministic_and_sized() {
        let a = super::generate(7, 10_000);
        assert_eq!(a, super::generate(7, 10_000));
        assert_ne!(a, super::generate(8, 10_000));
        assert!(a.len() >= 10_000 && a.len() < 11_000);
    }
}
