//! Built-in synthetic tasks with generators and verifiers, so RL can be tried with no downloads.
//! Every item is a user prompt, a label and the verifier's reward for a response; generation is
//! deterministic for a seed.
//!
//! - `repeat`: repeat a 4–6 digit number in `\boxed{}` — the smallest task, for the 2-core CPU
//!   demo, where a model of 0.1M parameters learns it in a minute.
//! - `addition`: the sum of two numbers below 100; the answer must be in `\boxed{}` (small enough
//!   for a tiny model trained on a laptop CPU).
//! - `arithmetic`: a multi-step integer expression; the answer must be in `\boxed{}`.
//! - `countdown`: reach a target from given numbers with `+ − × ÷`, each number at most once; the
//!   expression goes in `<answer>…</answer>` and is evaluated exactly (rationals).
//! - `string`: reverse, uppercase or sort the letters of a word; the result goes in
//!   `<answer>…</answer>`.

use crate::math_answer;
use ooze_core::SplitMix64;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    Repeat,
    Addition,
    Arithmetic,
    Countdown,
    String,
}

/// One generated problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskItem {
    pub prompt: String,
    pub label: String,
    /// A correct response (worked steps where the task has them), for SFT demonstrations.
    pub solution: String,
}

const WORDS: &[&str] = &[
    "planet", "river", "garden", "silver", "orange", "window", "forest", "bridge", "candle",
    "marble", "rocket", "puzzle", "harbor", "lantern", "meadow", "pepper",
];

impl Task {
    /// `n` items from `seed`.
    pub fn generate(self, n: usize, seed: u64) -> Vec<TaskItem> {
        let mut rng = SplitMix64::new(seed ^ (self as u64 + 1).wrapping_mul(0x51_7cc1_b727_220a));
        (0..n).map(|_| self.one(&mut rng)).collect()
    }

    fn one(self, rng: &mut SplitMix64) -> TaskItem {
        match self {
            Task::Repeat => {
                let digits = rng.range(4, 6);
                let number: String = (0..digits)
                    .map(|i| char::from(b'0' + rng.range(i64::from(i == 0), 9) as u8))
                    .collect();
                TaskItem {
                    prompt: format!("Repeat the number {number}. Answer with \\boxed{{...}}."),
                    solution: format!("\\boxed{{{number}}}"),
                    label: number,
                }
            }
            Task::Addition => {
                let (a, b) = (rng.range(0, 99), rng.range(0, 99));
                TaskItem {
                    prompt: format!("What is {a} + {b}? Answer with \\boxed{{...}}."),
                    label: (a + b).to_string(),
                    solution: format!("{a} + {b} = \\boxed{{{}}}", a + b),
                }
            }
            Task::Arithmetic => {
                let steps = rng.range(2, 4);
                let mut expr = rng.range(1, 20).to_string();
                let mut value = expr.parse::<i64>().expect("a number");
                let mut work = Vec::new();
                for _ in 0..steps {
                    let b = rng.range(1, 12);
                    let (op, next) = match rng.below(3) {
                        0 => ('+', value + b),
                        1 => ('-', value - b),
                        _ => ('*', value * b),
                    };
                    work.push(format!("{value} {op} {b} = {next}."));
                    expr = format!("({expr} {op} {b})");
                    value = next;
                }
                let expr = expr[1..expr.len() - 1].to_owned();
                TaskItem {
                    prompt: format!(
                        "Compute {expr}. Show your steps, then give the final answer as \\boxed{{...}}."
                    ),
                    label: value.to_string(),
                    solution: format!("{} \\boxed{{{value}}}", work.join(" ")),
                }
            }
            Task::Countdown => {
                // Build a reachable target from a random expression over the numbers.
                let numbers: Vec<i64> = (0..4).map(|_| rng.range(1, 25)).collect();
                let mut value = Rational::from(numbers[0]);
                let mut expression = numbers[0].to_string();
                for &n in &numbers[1..] {
                    let x = Rational::from(n);
                    let op;
                    (value, op) = match rng.below(3) {
                        0 => (value.add(x), '+'),
                        1 => (value.sub(x), '-'),
                        _ => (value.mul(x), '*'),
                    };
                    expression = format!("({expression}) {op} {n}");
                }
                let list = numbers
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                TaskItem {
                    prompt: format!(
                        "Using the numbers {list} (each at most once) and + - * / with parentheses, \
                         write an expression equal to {}. Put only the expression in <answer></answer>.",
                        value.num
                    ),
                    label: format!("{}|{list}", value.num),
                    solution: format!("<answer>{expression}</answer>"),
                }
            }
            Task::String => {
                let word = *rng.pick(WORDS);
                let (what, result) = match rng.below(3) {
                    0 => ("Reverse", word.chars().rev().collect::<String>()),
                    1 => ("Uppercase", word.to_uppercase()),
                    _ => {
                        let mut c: Vec<char> = word.chars().collect();
                        c.sort_unstable();
                        ("Sort the letters of", c.into_iter().collect())
                    }
                };
                TaskItem {
                    prompt: format!(
                        "{what} the word \"{word}\". Put only the result in <answer></answer>."
                    ),
                    solution: format!("<answer>{result}</answer>"),
                    label: result,
                }
            }
        }
    }

    /// A demonstration for `item`: its solution, or with probability `error_rate` a wrong one
    /// (the final answer changed), so that a model imitating it has something for RL to fix.
    pub fn demonstration(self, item: &TaskItem, rng: &mut SplitMix64, error_rate: f64) -> String {
        if (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 >= error_rate {
            return item.solution.clone();
        }
        let delta = *rng.pick(&[-2i64, -1, 1, 2]);
        match self {
            Task::Repeat | Task::Addition | Task::Arithmetic => {
                let wrong = item
                    .label
                    .parse::<i64>()
                    .map(|v| v + delta)
                    .unwrap_or(delta);
                let cut = item
                    .solution
                    .rfind("\\boxed{")
                    .unwrap_or(item.solution.len());
                format!("{}\\boxed{{{wrong}}}", &item.solution[..cut])
            }
            Task::Countdown => {
                let target = item.label.split('|').next().unwrap_or("0");
                let wrong = target.parse::<i64>().map(|v| v + delta).unwrap_or(delta);
                // A bare (wrong) number: it uses none of the given numbers' arithmetic.
                format!("<answer>{wrong}</answer>")
            }
            Task::String => {
                let mut chars: Vec<char> = item.label.chars().collect();
                if chars.len() > 1 {
                    let i = rng.below(chars.len() as u64 - 1) as usize;
                    chars.swap(i, i + 1);
                    if chars.iter().collect::<String>() == item.label {
                        chars.pop();
                    }
                }
                format!("<answer>{}</answer>", chars.into_iter().collect::<String>())
            }
        }
    }

    /// The reward of `response` for an item labelled `label`: 1 or 0.
    pub fn verify(self, response: &str, label: &str) -> f64 {
        let ok = match self {
            Task::Repeat | Task::Addition | Task::Arithmetic => {
                math_answer::last_boxed(response).is_some_and(|a| math_answer::equivalent(a, label))
            }
            Task::Countdown => answer_tag(response).is_some_and(|a| countdown_ok(a, label)),
            Task::String => answer_tag(response).is_some_and(|a| a.trim() == label),
        };
        ok as u8 as f64
    }
}

/// The content of the last `<answer>…</answer>`.
pub fn answer_tag(text: &str) -> Option<&str> {
    let start = text.rfind("<answer>")? + "<answer>".len();
    let end = text[start..].find("</answer>")?;
    Some(&text[start..start + end])
}

/// Whether `expression` uses only the label's numbers (each at most once) and equals its target.
fn countdown_ok(expression: &str, label: &str) -> bool {
    let Some((target, list)) = label.split_once('|') else {
        return false;
    };
    let (Ok(target), Ok(mut available)) = (
        target.parse::<i64>(),
        list.split(", ")
            .map(|n| n.parse::<i64>())
            .collect::<Result<Vec<_>, _>>(),
    ) else {
        return false;
    };
    let mut parser = Arith {
        chars: expression.chars().filter(|c| !c.is_whitespace()).collect(),
        at: 0,
        used: Vec::new(),
    };
    let Some(value) = parser.sum() else {
        return false;
    };
    if parser.at != parser.chars.len() {
        return false;
    }
    for n in parser.used {
        match available.iter().position(|&a| a == n) {
            Some(i) => {
                available.swap_remove(i);
            }
            None => return false,
        }
    }
    value == Rational::from(target)
}

/// Exact rational numbers for countdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rational {
    num: i64,
    den: i64,
}

impl From<i64> for Rational {
    fn from(n: i64) -> Rational {
        Rational { num: n, den: 1 }
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.abs().max(1)
    } else {
        gcd(b, a % b)
    }
}

impl Rational {
    fn new(num: i64, den: i64) -> Option<Rational> {
        if den == 0 {
            return None;
        }
        let g = gcd(num, den) * den.signum();
        Some(Rational {
            num: num / g,
            den: den / g,
        })
    }
    fn add(self, o: Rational) -> Rational {
        Rational::new(self.num * o.den + o.num * self.den, self.den * o.den).expect("den ≠ 0")
    }
    fn sub(self, o: Rational) -> Rational {
        Rational::new(self.num * o.den - o.num * self.den, self.den * o.den).expect("den ≠ 0")
    }
    fn mul(self, o: Rational) -> Rational {
        Rational::new(self.num * o.num, self.den * o.den).expect("den ≠ 0")
    }
    fn div(self, o: Rational) -> Option<Rational> {
        Rational::new(self.num * o.den, self.den * o.num)
    }
}

/// `+ − × ÷`, parentheses and integers, recording the integers used.
struct Arith {
    chars: Vec<char>,
    at: usize,
    used: Vec<i64>,
}

impl Arith {
    fn sum(&mut self) -> Option<Rational> {
        let mut v = self.product()?;
        while let Some(&c) = self.chars.get(self.at) {
            match c {
                '+' | '-' => {
                    self.at += 1;
                    let r = self.product()?;
                    v = if c == '+' { v.add(r) } else { v.sub(r) };
                }
                _ => break,
            }
        }
        Some(v)
    }

    fn product(&mut self) -> Option<Rational> {
        let mut v = self.atom()?;
        while let Some(&c) = self.chars.get(self.at) {
            match c {
                '*' | 'x' | '×' => {
                    self.at += 1;
                    v = v.mul(self.atom()?);
                }
                '/' | '÷' => {
                    self.at += 1;
                    v = v.div(self.atom()?)?;
                }
                _ => break,
            }
        }
        Some(v)
    }

    fn atom(&mut self) -> Option<Rational> {
        let c = *self.chars.get(self.at)?;
        if c == '(' {
            self.at += 1;
            let v = self.sum()?;
            if self.chars.get(self.at) != Some(&')') {
                return None;
            }
            self.at += 1;
            return Some(v);
        }
        let start = self.at;
        while self.chars.get(self.at).is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        if start == self.at {
            return None;
        }
        let n: i64 = self.chars[start..self.at]
            .iter()
            .collect::<String>()
            .parse()
            .ok()?;
        self.used.push(n);
        Some(Rational::from(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_seeded_and_labels_verify() {
        for task in [
            Task::Repeat,
            Task::Addition,
            Task::Arithmetic,
            Task::Countdown,
            Task::String,
        ] {
            let items = task.generate(50, 3);
            assert_eq!(items, task.generate(50, 3));
            assert_ne!(items, task.generate(50, 4));
            let mut rng = SplitMix64::new(9);
            for item in &items {
                assert_eq!(task.verify(&item.solution, &item.label), 1.0, "{item:?}");
                assert_eq!(task.verify("I don't know", &item.label), 0.0);
                assert_eq!(task.demonstration(item, &mut rng, 0.0), item.solution);
                let wrong = task.demonstration(item, &mut rng, 1.0);
                assert_eq!(task.verify(&wrong, &item.label), 0.0, "{item:?}: {wrong}");
            }
        }
    }

    #[test]
    fn countdown_checks_numbers_and_value_exactly() {
        let label = "24|4, 6, 2, 1";
        assert_eq!(Task::Countdown.verify("<answer>4*6</answer>", label), 1.0);
        assert_eq!(
            Task::Countdown.verify("<answer>(6/2)*4*2</answer>", label),
            0.0,
            "2 used twice"
        );
        assert_eq!(
            Task::Countdown.verify("<answer>(6-2)*(4+2)</answer>", label),
            0.0
        );
        assert_eq!(
            Task::Countdown.verify("<answer>6/(1/4)</answer>", label),
            1.0
        );
        assert_eq!(Task::Countdown.verify("<answer>4*6*</answer>", label), 0.0);
        assert_eq!(Task::Countdown.verify("<answer>24</answer>", label), 0.0);
        assert_eq!(
            Task::Countdown.verify("<answer>4/0</answer>", "0|4, 0"),
            0.0
        );
    }
}
