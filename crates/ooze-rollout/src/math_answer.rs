//! Checking a model's final math answer against a label.
//!
//! 1. **Extraction:** the content of the last `\boxed{…}` (or `\fbox{…}`), braces matched; or the
//!    last match of a configured pattern (its first capture group).
//! 2. **Normalisation** of common LaTeX and number forms: `$`, `\left`/`\right`, spacing commands,
//!    `\text{…}`/`\mathrm{…}` (kept content), `\dfrac`/`\tfrac`, degree signs, `\%`, thousands
//!    separators (`1,000`), a trailing period, `x = ` prefixes, surrounding whitespace.
//! 3. **Equivalence:** equal normalised strings; or both sides evaluate to numbers within a relative
//!    1e-6 (fractions, `\frac{a}{b}`, `\sqrt{…}`, `\pi`, powers, percentages); or — simple symbolic
//!    equivalence — both are expressions in the same single-letter variables that agree at several
//!    fixed points.

use regex::Regex;
use std::sync::OnceLock;

/// The content of the last `\boxed{…}` / `\fbox{…}` in `text` (nested braces matched).
pub fn last_boxed(text: &str) -> Option<&str> {
    let start = ["\\boxed", "\\fbox"]
        .iter()
        .filter_map(|tag| text.rfind(tag).map(|i| i + tag.len()))
        .max()?;
    let rest = &text[start..];
    let open = rest.find('{')?;
    if !rest[..open].trim().is_empty() {
        return None;
    }
    let mut depth = 0usize;
    for (i, c) in rest[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&rest[open + 1..open + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The answer in `text`: the last match of `pattern` (its first group, or the whole match) when
/// given, else the last `\boxed{…}`.
pub fn extract_answer<'t>(text: &'t str, pattern: Option<&Regex>) -> Option<&'t str> {
    match pattern {
        Some(re) => re
            .captures_iter(text)
            .last()
            .and_then(|c| c.get(1).or_else(|| c.get(0)))
            .map(|m| m.as_str()),
        None => last_boxed(text),
    }
}

/// Replaces `\cmd{x}` by `x` for the given commands (one level of braces).
fn unwrap_command(s: &str, command: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(command) {
        out.push_str(&rest[..i]);
        let after = &rest[i + command.len()..];
        match after
            .strip_prefix('{')
            .and_then(|a| a.find('}').map(|j| (a, j)))
        {
            Some((a, j)) => {
                out.push_str(&a[..j]);
                rest = &a[j + 1..];
            }
            None => {
                out.push_str(command);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The normal form used for comparison.
pub fn normalize(answer: &str) -> String {
    let mut s = answer.trim().to_owned();
    for command in ["\\text", "\\mathrm", "\\textbf", "\\mbox"] {
        s = unwrap_command(&s, command);
    }
    for (from, to) in [
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\:", ""),
        ("\\ ", ""),
        ("\\quad", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("^{\\circ}", ""),
        ("^\\circ", ""),
        ("\\circ", ""),
        ("\\degree", ""),
        ("\\%", "%"),
        ("\\$", ""),
        ("$", ""),
        ("\\cdot", "*"),
        ("\\times", "*"),
        ("\\div", "/"),
    ] {
        s = s.replace(from, to);
    }
    let mut s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    // "x=5" → "5" (a single variable name before the only "=").
    if let Some((lhs, rhs)) = s.split_once('=') {
        if lhs.len() <= 2 && lhs.chars().all(|c| c.is_ascii_alphabetic()) && !rhs.contains('=') {
            s = rhs.to_owned();
        }
    }
    while s.ends_with('.') {
        s.pop();
    }
    // Thousands separators: 1,234,567 → 1234567 (only where every group has three digits).
    static THOUSANDS: OnceLock<Regex> = OnceLock::new();
    let thousands = THOUSANDS.get_or_init(|| {
        Regex::new(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$").expect("invariant: valid regex")
    });
    if thousands.is_match(&s) {
        s = s.replace(',', "");
    }
    s.to_lowercase()
}

/// Whether `answer` and `label` are the same value (see the module docs).
pub fn equivalent(answer: &str, label: &str) -> bool {
    let (a, b) = (normalize(answer), normalize(label));
    if a.is_empty() {
        return false;
    }
    if a == b {
        return true;
    }
    let (ea, eb) = (parse(&a), parse(&b));
    let (Some(ea), Some(eb)) = (ea, eb) else {
        return false;
    };
    let mut vars = Vec::new();
    ea.variables(&mut vars);
    let mut vb = Vec::new();
    eb.variables(&mut vb);
    vars.sort_unstable();
    vars.dedup();
    vb.sort_unstable();
    vb.dedup();
    if vars != vb {
        return false;
    }
    const POINTS: [f64; 4] = [0.37, 1.91, -2.53, 3.27];
    (0..if vars.is_empty() { 1 } else { POINTS.len() }).all(|k| {
        let at = |v: char| {
            let i = vars.iter().position(|&x| x == v).unwrap_or(0);
            POINTS[(k + i) % POINTS.len()] + i as f64 * 0.11
        };
        match (ea.eval(&at), eb.eval(&at)) {
            (Some(x), Some(y)) if x.is_finite() && y.is_finite() => {
                (x - y).abs() <= 1e-6 * x.abs().max(y.abs()).max(1.0)
            }
            _ => false,
        }
    })
}

/// A small arithmetic expression.
#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Num(f64),
    Var(char),
    Neg(Box<Expr>),
    Bin(char, Box<Expr>, Box<Expr>),
    Sqrt(Box<Expr>),
}

impl Expr {
    fn variables(&self, out: &mut Vec<char>) {
        match self {
            Expr::Var(v) => out.push(*v),
            Expr::Neg(e) | Expr::Sqrt(e) => e.variables(out),
            Expr::Bin(_, a, b) => {
                a.variables(out);
                b.variables(out);
            }
            Expr::Num(_) => {}
        }
    }

    fn eval(&self, at: &dyn Fn(char) -> f64) -> Option<f64> {
        Some(match self {
            Expr::Num(x) => *x,
            Expr::Var(v) => at(*v),
            Expr::Neg(e) => -e.eval(at)?,
            Expr::Sqrt(e) => e.eval(at)?.sqrt(),
            Expr::Bin(op, a, b) => {
                let (x, y) = (a.eval(at)?, b.eval(at)?);
                match op {
                    '+' => x + y,
                    '-' => x - y,
                    '*' => x * y,
                    '/' => x / y,
                    '^' => x.powf(y),
                    _ => return None,
                }
            }
        })
    }
}

/// Parses a normalised answer; `None` for anything outside the small grammar.
fn parse(s: &str) -> Option<Expr> {
    let tokens = tokenize(s)?;
    let mut p = Parser { tokens, at: 0 };
    let e = p.sum()?;
    (p.at == p.tokens.len()).then_some(e)
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Var(char),
    Op(char),
    Open,
    Close,
    Frac,
    Sqrt,
    Percent,
}

fn tokenize(s: &str) -> Option<Vec<Tok>> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            out.push(Tok::Num(text.parse().ok()?));
            continue;
        }
        if c == '\\' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i].is_ascii_alphabetic() {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            out.push(match name.as_str() {
                "frac" => Tok::Frac,
                "sqrt" => Tok::Sqrt,
                "pi" => Tok::Num(std::f64::consts::PI),
                _ => return None,
            });
            continue;
        }
        out.push(match c {
            '+' | '-' | '*' | '/' | '^' => Tok::Op(c),
            '(' | '{' | '[' => Tok::Open,
            ')' | '}' | ']' => Tok::Close,
            '%' => Tok::Percent,
            'a'..='z' => Tok::Var(c),
            _ => return None,
        });
        i += 1;
    }
    Some(out)
}

struct Parser {
    tokens: Vec<Tok>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.at)
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn sum(&mut self) -> Option<Expr> {
        let mut e = self.product()?;
        loop {
            if self.eat(&Tok::Op('+')) {
                e = Expr::Bin('+', Box::new(e), Box::new(self.product()?));
            } else if self.eat(&Tok::Op('-')) {
                e = Expr::Bin('-', Box::new(e), Box::new(self.product()?));
            } else {
                return Some(e);
            }
        }
    }

    fn product(&mut self) -> Option<Expr> {
        let mut e = self.unary()?;
        loop {
            if self.eat(&Tok::Op('*')) {
                e = Expr::Bin('*', Box::new(e), Box::new(self.unary()?));
            } else if self.eat(&Tok::Op('/')) {
                e = Expr::Bin('/', Box::new(e), Box::new(self.unary()?));
            } else if matches!(
                self.peek(),
                Some(Tok::Num(_) | Tok::Var(_) | Tok::Open | Tok::Frac | Tok::Sqrt)
            ) {
                // Implicit multiplication: 2x, 3\sqrt{2}, (a)(b).
                e = Expr::Bin('*', Box::new(e), Box::new(self.power()?));
            } else {
                return Some(e);
            }
        }
    }

    fn unary(&mut self) -> Option<Expr> {
        if self.eat(&Tok::Op('-')) {
            return Some(Expr::Neg(Box::new(self.unary()?)));
        }
        if self.eat(&Tok::Op('+')) {
            return self.unary();
        }
        self.power()
    }

    fn power(&mut self) -> Option<Expr> {
        let base = self.atom()?;
        if self.eat(&Tok::Op('^')) {
            let exponent = self.unary()?;
            return Some(Expr::Bin('^', Box::new(base), Box::new(exponent)));
        }
        Some(base)
    }

    fn atom(&mut self) -> Option<Expr> {
        let t = self.peek()?.clone();
        self.at += 1;
        let e = match t {
            Tok::Num(x) => Expr::Num(x),
            Tok::Var(v) => Expr::Var(v),
            Tok::Open => {
                let e = self.sum()?;
                if !self.eat(&Tok::Close) {
                    return None;
                }
                e
            }
            Tok::Frac => {
                let num = self.atom()?;
                let den = self.atom()?;
                Expr::Bin('/', Box::new(num), Box::new(den))
            }
            Tok::Sqrt => Expr::Sqrt(Box::new(self.atom()?)),
            _ => return None,
        };
        if self.eat(&Tok::Percent) {
            return Some(Expr::Bin('/', Box::new(e), Box::new(Expr::Num(100.0))));
        }
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_extraction_matches_braces_and_takes_the_last() {
        let text = r"First \boxed{1}, then finally \boxed{\frac{1}{2}} done.";
        assert_eq!(last_boxed(text), Some(r"\frac{1}{2}"));
        assert_eq!(last_boxed("no box"), None);
        assert_eq!(last_boxed(r"\boxed{unclosed"), None);
        assert_eq!(last_boxed(r"\fbox{7}"), Some("7"));
        let re = Regex::new(r"Answer:\s*(\S+)").unwrap();
        assert_eq!(extract_answer("Answer: 3\nAnswer: 4", Some(&re)), Some("4"));
    }

    #[test]
    fn equivalent_forms() {
        for (a, b) in [
            ("1,000", "1000"),
            (r"\frac{1}{2}", "0.5"),
            (r"\dfrac{3}{4}", "3/4"),
            ("50\\%", "0.5"),
            (r"90^\circ", "90"),
            (r"\text{5 apples}", "5apples"),
            ("x = 7", "7"),
            ("7.", "7"),
            (r"2\sqrt{2}", r"\sqrt{8}"),
            (r"\pi/2", "1.5707963268"),
            ("2x+2", "2(x+1)"),
            ("(a+b)^2", "a^2+2ab+b^2"),
            (r"\left(3\right)", "3"),
        ] {
            assert!(equivalent(a, b), "{a} ~ {b}");
        }
        for (a, b) in [
            ("3", "4"),
            ("x+1", "y+1"),
            ("2x", "x^2"),
            ("", "0"),
            ("1,00", "100"),
            ("abc", "abd"),
        ] {
            assert!(!equivalent(a, b), "{a} !~ {b}");
        }
    }
}
