//! Question-answering rewards with SQuAD's normalisation: lowercase, punctuation removed, the
//! articles a/an/the removed, whitespace collapsed. Exact match and token-level F1, each the best
//! over the gold answers.

use std::collections::HashMap;

/// SQuAD's answer normalisation.
pub fn normalize(text: &str) -> String {
    let lower = text.to_lowercase();
    let no_punct: String = lower
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    no_punct
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// 1 when the normalised prediction equals a normalised gold answer, else 0.
pub fn exact_match(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize(prediction);
    golds.iter().any(|g| normalize(g) == p) as u8 as f64
}

/// The best token-level F1 between the prediction and a gold answer.
pub fn f1(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize(prediction);
    let predicted: Vec<&str> = p.split_whitespace().collect();
    golds
        .iter()
        .map(|g| {
            let g = normalize(g);
            let gold: Vec<&str> = g.split_whitespace().collect();
            if predicted.is_empty() || gold.is_empty() {
                return (predicted.is_empty() && gold.is_empty()) as u8 as f64;
            }
            let mut counts: HashMap<&str, i64> = HashMap::new();
            for t in &gold {
                *counts.entry(t).or_default() += 1;
            }
            let mut common = 0;
            for t in &predicted {
                if let Some(c) = counts.get_mut(t) {
                    if *c > 0 {
                        *c -= 1;
                        common += 1;
                    }
                }
            }
            if common == 0 {
                return 0.0;
            }
            let precision = common as f64 / predicted.len() as f64;
            let recall = common as f64 / gold.len() as f64;
            2.0 * precision * recall / (precision + recall)
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squad_normalisation_em_and_f1() {
        assert_eq!(normalize("The  Eiffel Tower!"), "eiffel tower");
        let golds = vec!["Eiffel Tower".to_owned(), "the tower".to_owned()];
        assert_eq!(exact_match("the eiffel tower.", &golds), 1.0);
        assert_eq!(exact_match("Paris", &golds), 0.0);
        // "tower in paris" vs "eiffel tower": 1 common token, P = 1/3, R = 1/2.
        let f = f1("tower in Paris", &["Eiffel Tower".to_owned()]);
        assert!((f - 0.4).abs() < 1e-12, "{f}");
        assert_eq!(f1("", &["x".to_owned()]), 0.0);
    }
}
