//! The teacher of on-policy distillation (`advantage.opd_coef`): a frozen model whose log-probs of
//! the student's own responses pull the student towards it. The advantage of each trained token
//! gets `−opd_coef·(logp_student − logp_teacher)` (`ooze_algo::advantage`), so tokens the teacher
//! finds likelier than the student are pushed up.
//!
//! The teacher is either a model scored in this process (the trainer's own micro-batched scoring
//! pass, the same arithmetic as `logp_old`) or any scorer behind [`TeacherScorer`] — `ooze-run`
//! implements one over an SGLang-compatible `/generate` endpoint that returns prompt log-probs.
//!
//! Both sides use the one log-prob definition, `log_softmax(logits / T)` at the token with the
//! rollout temperature `T`. [`distillation_gap`] gives the metrics: the mean student − teacher
//! log-prob gap over trained tokens (the `k1` estimate of KL(student ‖ teacher) on the student's
//! own samples) and the `k3` estimate `exp(t − s) − (t − s) − 1`, which is never negative.

use crate::TrainError;
use ooze_core::Sample;
use ooze_model::Decoder;

/// Log-probs of response tokens from somewhere other than an in-process model.
pub trait TeacherScorer: Send {
    /// `log_softmax(logits / temperature)` of every response token of every sample, in order
    /// (`result[i].len() == samples[i].response_length`).
    fn response_log_probs(
        &self,
        samples: &[Sample],
        temperature: f64,
    ) -> Result<Vec<Vec<f64>>, TrainError>;
}

/// Where the teacher's log-probs come from.
pub enum Teacher {
    /// Scored in this process, micro-batched like the policy.
    Model(Box<Decoder>),
    /// Scored elsewhere (an HTTP endpoint).
    Remote(Box<dyn TeacherScorer>),
}

/// The student − teacher log-prob gap over a step's trained tokens: `(mean gap, k3 KL)`.
pub fn distillation_gap(
    samples: &[Sample],
    student: &[Vec<f64>],
    teacher: &[Vec<f64>],
) -> (f64, f64) {
    let (mut gap, mut kl, mut count) = (0.0, 0.0, 0.0);
    for ((s, st), te) in samples.iter().zip(student).zip(teacher) {
        for ((&m, &x), &t) in s.loss_mask.iter().zip(st).zip(te) {
            if m == 0 {
                continue;
            }
            let m = m as f64;
            let d = t - x;
            gap += m * (x - t);
            kl += m * (d.exp() - d - 1.0);
            count += m;
        }
    }
    if count == 0.0 {
        (0.0, 0.0)
    } else {
        (gap / count, kl / count)
    }
}

/// Checks that a scorer answered one log-prob per response token of every sample.
pub fn check_shape(
    samples: &[Sample],
    scores: &[Vec<f64>],
    source: &str,
) -> Result<(), TrainError> {
    if scores.len() != samples.len() {
        return Err(TrainError::Teacher(format!(
            "{source} scored {} samples, {} were sent",
            scores.len(),
            samples.len()
        )));
    }
    for (i, (s, lp)) in samples.iter().zip(scores).enumerate() {
        if lp.len() != s.response_length {
            return Err(TrainError::Teacher(format!(
                "{source}: sample {i} has {} response tokens, the teacher gave {} log-probs",
                s.response_length,
                lp.len()
            )));
        }
        if let Some(j) = lp.iter().position(|x| !x.is_finite()) {
            return Err(TrainError::Teacher(format!(
                "{source}: sample {i} token {j}: log-prob {} is not finite",
                lp[j]
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(mask: Vec<u8>) -> Sample {
        let mut s = Sample::with_prompt(vec![1; 2]);
        s.push_observation(&vec![1; mask.len()]);
        s.loss_mask = mask;
        s
    }

    #[test]
    fn gap_counts_trained_tokens_only() {
        let samples = [sample(vec![1, 0, 1])];
        let student = [vec![-1.0, -9.0, -2.0]];
        let teacher = [vec![-0.5, 0.0, -2.0]];
        let (gap, kl) = distillation_gap(&samples, &student, &teacher);
        assert!((gap - (-0.25)).abs() < 1e-12, "{gap}");
        let d: f64 = 0.5;
        assert!((kl - (d.exp() - d - 1.0) / 2.0).abs() < 1e-12, "{kl}");
        let (gap, kl) = distillation_gap(&samples, &student, &student);
        assert_eq!((gap, kl), (0.0, 0.0));
    }

    #[test]
    fn shape_errors_name_the_sample() {
        let samples = [sample(vec![1, 1])];
        let e = check_shape(&samples, &[vec![-1.0]], "teacher http://t").unwrap_err();
        assert!(
            e.to_string().contains("sample 0 has 2 response tokens"),
            "{e}"
        );
        let e = check_shape(&samples, &[vec![-1.0, f64::NAN]], "t").unwrap_err();
        assert!(e.to_string().contains("token 1"), "{e}");
        assert!(check_shape(&samples, &[vec![-1.0, -2.0]], "t").is_ok());
    }
}
