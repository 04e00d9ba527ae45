//! `[critic]` and `[teacher]`: the models PPO and on-policy distillation add beside the policy, and
//! the checks that refuse recipe keys which would do nothing — a section without the algorithm that
//! uses it, a reference model without a KL term, settings that only act together with another.

use super::{DataSection, Mode, Recipe};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[critic]`: the value model of `estimator = "ppo"`. Without the section the critic starts from
/// the policy's weights with a fresh (zero) value head and learns at `trainer.lr`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CriticSection {
    /// A model directory to start from (a saved critic with its `score.weight` head, or any model
    /// of the policy's family, whose head then starts at zero). Default: `model.path`.
    pub path: Option<PathBuf>,
    /// Peak learning rate (the policy's warm-up and decay). Default: `trainer.lr`.
    pub lr: Option<f64>,
    /// How far a value may move from its pre-update value before the clipped loss takes over.
    pub value_clip: f64,
    /// Optimizer steps at the start in which only the critic learns (the policy is frozen).
    pub warmup_steps: u64,
}

impl Default for CriticSection {
    fn default() -> Self {
        CriticSection {
            path: None,
            lr: None,
            value_clip: 0.2,
            warmup_steps: 0,
        }
    }
}

/// `[teacher]`: the model whose log-probs on-policy distillation pulls the policy towards.
/// Exactly one source: `path` (a model directory, scored in this process on the policy's
/// device) or `url` (a server with SGLang's `/generate` prompt log-probs, such as `ooze serve`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TeacherSection {
    pub path: Option<PathBuf>,
    /// Base URL, e.g. `http://127.0.0.1:30000` (the client posts to `{url}/generate`).
    pub url: Option<String>,
    /// `url`: seconds per request.
    pub timeout_secs: f64,
    /// `url`: requests in flight at once.
    pub concurrency: usize,
}

impl Default for TeacherSection {
    fn default() -> Self {
        TeacherSection {
            path: None,
            url: None,
            timeout_secs: 120.0,
            concurrency: 16,
        }
    }
}

impl Recipe {
    /// The critic, the teacher and the models they need.
    pub(super) fn check_algorithm(&self) -> Result<(), String> {
        let a = &self.algorithm;
        let ppo = a.advantage.estimator == ooze_algo::Estimator::Ppo;
        let defaults = ooze_algo::LossConfig::default();
        if a.loss.value_clip != defaults.value_clip {
            return Err(
                "algorithm.loss.value_clip: the critic's value clip is set as critic.value_clip"
                    .into(),
            );
        }
        if a.loss.value_coef != defaults.value_coef && !ppo {
            return Err(format!(
                "algorithm.loss.value_coef applies to the critic of estimator = \"ppo\" (the estimator is \"{}\")",
                a.advantage.estimator.name()
            ));
        }
        if let Some(c) = &self.critic {
            if !ppo {
                return Err(format!(
                    "[critic] is the value model of estimator = \"ppo\"; with \"{}\" it would never be used (remove the section or set algorithm.advantage.estimator = \"ppo\")",
                    a.advantage.estimator.name()
                ));
            }
            if let Some(lr) = c.lr.filter(|lr| !(*lr > 0.0 && lr.is_finite())) {
                return Err(format!("critic.lr must be a positive number, got {lr}"));
            }
            if !(c.value_clip > 0.0 && c.value_clip.is_finite()) {
                return Err(format!(
                    "critic.value_clip must be a positive number, got {}",
                    c.value_clip
                ));
            }
        }
        let opd = a.advantage.opd_coef != 0.0;
        match (&self.teacher, opd) {
            (None, true) => {
                return Err("algorithm.advantage.opd_coef needs a [teacher] section: path (a model directory) or url (a /generate server)".into())
            }
            (Some(_), false) => {
                return Err("[teacher] is used by on-policy distillation only: set algorithm.advantage.opd_coef (> 0) or remove the section".into())
            }
            (Some(t), true) => {
                if t.path.is_some() == t.url.is_some() {
                    return Err("[teacher] needs exactly one source: path (a model directory) or url (a server with SGLang's /generate)".into());
                }
                if t.timeout_secs.is_nan() || t.timeout_secs <= 0.0 || t.concurrency == 0 {
                    return Err("teacher.timeout_secs and teacher.concurrency must be positive".into());
                }
            }
            (None, false) => {}
        }
        if !a.advantage.opd_coef.is_finite() || a.advantage.opd_coef < 0.0 {
            return Err(format!(
                "algorithm.advantage.opd_coef must be ≥ 0, got {}",
                a.advantage.opd_coef
            ));
        }
        if a.advantage.kl_coef != 0.0
            && !matches!(
                a.advantage.estimator,
                ooze_algo::Estimator::ReinforcePlusPlus
                    | ooze_algo::Estimator::ReinforcePlusPlusBaseline
                    | ooze_algo::Estimator::Ppo
            )
        {
            return Err(format!(
                "algorithm.advantage.kl_coef (a KL penalty in the reward) applies to reinforce_plus_plus, reinforce_plus_plus_baseline and ppo, not \"{}\"; use algorithm.loss.kl_loss_coef instead",
                a.advantage.estimator.name()
            ));
        }
        if let Some(c) = a.advantage.clip.filter(|c| c.is_nan() || *c <= 0.0) {
            return Err(format!("algorithm.advantage.clip must be > 0, got {c}"));
        }
        let kl = a.advantage.kl_coef != 0.0 || a.loss.kl_loss_coef != 0.0;
        if self.model.reference.is_some() && !kl {
            return Err("model.reference is only loaded for a KL term: set algorithm.advantage.kl_coef or algorithm.loss.kl_loss_coef, or remove it".into());
        }
        if self.trainer.mode == Mode::RolloutOnly && (ppo || opd || kl) {
            return Err("trainer.mode = \"rollout_only\" trains nothing: the critic, teacher and reference settings would be unused".into());
        }
        Ok(())
    }
}

impl Recipe {
    /// Keys that only act together with another: set without it, they would do nothing.
    pub(super) fn check_inert_keys(&self) -> Result<(), String> {
        let d = &self.data;
        let defaults = DataSection::default();
        let r = &self.rollout;
        let t = &self.trainer;
        let a = &self.algorithm;
        let (adv, loss) = (
            ooze_algo::AdvantageConfig::default(),
            ooze_algo::LossConfig::default(),
        );
        use ooze_algo::{Estimator as E, PolicyLoss as P};
        let est = a.advantage.estimator;
        let filtering = r.dynamic_sampling || r.drop_truncated_groups;
        let inert: &[(bool, &str)] = &[
            (
                !a.advantage.std_normalization && !matches!(est, E::Grpo | E::Gspo | E::Cispo),
                "algorithm.advantage.std_normalization applies to estimator = \"grpo\", \"gspo\" or \"cispo\"",
            ),
            // gspo and cispo are objectives: as estimators they compute grpo's advantages, and
            // alone would run ppo_clip under another name.
            (
                est == E::Gspo && a.loss.policy != P::Gspo,
                "algorithm.advantage.estimator = \"gspo\" computes grpo's advantages; GSPO's sequence-level objective is algorithm.loss.policy = \"gspo\": set it too, or use estimator = \"grpo\"",
            ),
            (
                est == E::Cispo && a.loss.policy != P::Cispo,
                "algorithm.advantage.estimator = \"cispo\" computes grpo's advantages; CISPO's clipped-weight objective is algorithm.loss.policy = \"cispo\": set it too, or use estimator = \"grpo\"",
            ),
            (
                a.advantage.gamma != adv.gamma && !matches!(est, E::ReinforcePlusPlus | E::Ppo),
                "algorithm.advantage.gamma applies to estimator = \"reinforce_plus_plus\" or \"ppo\"",
            ),
            (
                a.advantage.lambda != adv.lambda && est != E::Ppo,
                "algorithm.advantage.lambda (GAE) applies to estimator = \"ppo\"",
            ),
            (
                a.advantage.kl_estimator != adv.kl_estimator && a.advantage.kl_coef == 0.0,
                "algorithm.advantage.kl_estimator needs algorithm.advantage.kl_coef",
            ),
            (
                a.advantage.normalize_advantages
                    && matches!(est, E::ReinforcePlusPlus | E::ReinforcePlusPlusBaseline),
                "algorithm.advantage.normalize_advantages is always on for reinforce_plus_plus and its baseline variant",
            ),
            (
                (a.loss.kl_estimator != loss.kl_estimator || a.loss.kl_unbiased)
                    && a.loss.kl_loss_coef == 0.0,
                "algorithm.loss.kl_estimator and kl_unbiased need algorithm.loss.kl_loss_coef",
            ),
            (
                a.loss.policy == P::Sft
                    && (a.loss.eps_low != loss.eps_low || a.loss.eps_high.is_some()),
                "algorithm.loss.eps_low and eps_high clip a ratio; policy = \"sft\" has none",
            ),
            (
                a.loss.dual_clip.is_some() && !matches!(a.loss.policy, P::PpoClip | P::Gspo),
                "algorithm.loss.dual_clip applies to policy = \"ppo_clip\" or \"gspo\"",
            ),
            (
                !filtering
                    && (r.over_sampling_batch_size.is_some()
                        || r.max_rounds != super::RolloutSection::default().max_rounds),
                "rollout.over_sampling_batch_size and max_rounds fill filtered batches: they need rollout.dynamic_sampling or drop_truncated_groups",
            ),
            (
                d.path.is_some() && (d.task_size != defaults.task_size || d.task_seed != defaults.task_seed),
                "data.task_size and data.task_seed apply to data.task, not to data.path",
            ),
            (
                d.task.is_some()
                    && self.eval.datasets.iter().all(|e| e.path.is_none())
                    && (d.input_key != defaults.input_key
                        || d.label_key != defaults.label_key
                        || d.metadata_key.is_some()
                        || d.tools_key.is_some()
                        || d.skip_bad_rows),
                "data.input_key, label_key, metadata_key, tools_key and skip_bad_rows apply to data.path (and eval paths), not to data.task",
            ),
            (
                !d.apply_chat_template && d.system_prompt.is_some(),
                "data.system_prompt is rendered by the chat template: it needs data.apply_chat_template = true",
            ),
            (
                !d.shuffle && d.seed != defaults.seed,
                "data.seed seeds the shuffle: it needs data.shuffle = true",
            ),
            (
                !r.dynamic_sampling && r.min_reward_std != 0.0,
                "rollout.min_reward_std filters groups under dynamic sampling: it needs rollout.dynamic_sampling = true",
            ),
            (
                t.replay_from.is_some() && t.mode != Mode::Replay,
                "trainer.replay_from is read by trainer.mode = \"replay\" only",
            ),
            (
                self.algorithm.loss.observation_coef != 0.0
                    && !self
                        .agent
                        .spec()
                        .is_some_and(|spec| spec.writes_observations()),
                "algorithm.loss.observation_coef trains the tokens an environment writes into a response; of the agents only agent.type = \"search_r1\", \"retool\" and \"terminal\" write them (the others rebuild their prompts)",
            ),
            (
                t.decay == ooze_train::Decay::Constant && t.min_lr_ratio != 0.0,
                "trainer.min_lr_ratio is where a decay ends: it needs trainer.decay = \"linear\" or \"cosine\"",
            ),
        ];
        match inert.iter().find(|(bad, _)| *bad) {
            Some((_, message)) => Err((*message).into()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recipe::tests::{parse, MIN};

    #[test]
    fn the_observation_term_needs_an_agent_that_writes_observations() {
        let e = parse(MIN, &["algorithm.loss.observation_coef=0.05"]).unwrap_err();
        assert!(
            e.contains("algorithm.loss.observation_coef trains the tokens an environment writes"),
            "{e}"
        );
    }

    #[test]
    fn critic_and_teacher_need_their_algorithm() {
        let e = parse(MIN, &["critic.lr=1e-4"]).unwrap_err();
        assert!(
            e.contains("[critic] is the value model of estimator = \"ppo\""),
            "{e}"
        );
        let r = parse(MIN, &["algorithm.advantage.estimator=\"ppo\""]).unwrap();
        assert_eq!(r.critic_settings(), CriticSection::default());
        let r = parse(
            MIN,
            &[
                "algorithm.advantage.estimator=\"ppo\"",
                "critic.warmup_steps=3",
                "critic.lr=1e-4",
            ],
        )
        .unwrap();
        assert_eq!(r.critic_settings().warmup_steps, 3);
        let e = parse(
            MIN,
            &[
                "algorithm.advantage.estimator=\"ppo\"",
                "critic.value_clip=0",
            ],
        )
        .unwrap_err();
        assert!(
            e.contains("critic.value_clip must be a positive number"),
            "{e}"
        );
        let e = parse(MIN, &["algorithm.loss.value_clip=0.5"]).unwrap_err();
        assert!(e.contains("critic.value_clip"), "{e}");
        let e = parse(MIN, &["algorithm.loss.value_coef=0.5"]).unwrap_err();
        assert!(e.contains("value_coef applies to the critic"), "{e}");
        let e = parse(MIN, &["algorithm.advantage.opd_coef=1.0"]).unwrap_err();
        assert!(e.contains("opd_coef needs a [teacher] section"), "{e}");
        let e = parse(MIN, &["teacher.path=\"t\""]).unwrap_err();
        assert!(e.contains("set algorithm.advantage.opd_coef"), "{e}");
        let e = parse(
            MIN,
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher={path = \"t\", url = \"http://x\"}",
            ],
        )
        .unwrap_err();
        assert!(e.contains("exactly one source"), "{e}");
        let r = parse(
            MIN,
            &[
                "algorithm.advantage.opd_coef=0.5",
                "teacher.url=\"http://127.0.0.1:1\"",
            ],
        )
        .unwrap();
        assert_eq!(r.teacher.unwrap().concurrency, 16);
        let e = parse(MIN, &["teacher.tmeout_secs=3"]).unwrap_err();
        assert!(e.contains("unknown field `tmeout_secs`"), "{e}");
    }

    #[test]
    fn keys_that_would_do_nothing_are_refused() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["model.reference=\"r\""],
                "model.reference is only loaded for a KL term",
            ),
            (&["data.input_key=\"q\""], "apply to data.path"),
            (
                &["data.apply_chat_template=false", "data.system_prompt=\"x\""],
                "needs data.apply_chat_template",
            ),
            (&["data.shuffle=false", "data.seed=7"], "needs data.shuffle"),
            (
                &["rollout.min_reward_std=0.1"],
                "needs rollout.dynamic_sampling",
            ),
            (
                &["trainer.replay_from=\"x\""],
                "trainer.replay_from is read by",
            ),
            (&["trainer.min_lr_ratio=0.1"], "needs trainer.decay"),
            (
                &["algorithm.advantage.kl_coef=0.1"],
                "algorithm.advantage.kl_coef (a KL penalty",
            ),
            (
                &["algorithm.advantage.clip=0"],
                "algorithm.advantage.clip must be > 0",
            ),
            (
                &[
                    "algorithm.advantage.estimator=\"rloo\"",
                    "algorithm.advantage.std_normalization=false",
                ],
                "std_normalization applies to",
            ),
            (
                &["algorithm.advantage.gamma=0.9"],
                "algorithm.advantage.gamma applies to",
            ),
            (
                &["algorithm.advantage.lambda=0.9"],
                "algorithm.advantage.lambda (GAE)",
            ),
            (
                &["algorithm.advantage.kl_estimator=\"k1\""],
                "kl_estimator needs algorithm.advantage.kl_coef",
            ),
            (
                &[
                    "algorithm.advantage.estimator=\"reinforce_plus_plus\"",
                    "algorithm.advantage.normalize_advantages=true",
                ],
                "always on for reinforce_plus_plus",
            ),
            (
                &["algorithm.loss.kl_unbiased=true"],
                "need algorithm.loss.kl_loss_coef",
            ),
            (
                &[
                    "algorithm.loss.policy=\"sft\"",
                    "algorithm.loss.eps_low=0.1",
                ],
                "policy = \"sft\" has none",
            ),
            (
                &[
                    "algorithm.loss.policy=\"cispo\"",
                    "algorithm.loss.dual_clip=3",
                ],
                "dual_clip applies to",
            ),
            (
                &["algorithm.advantage.estimator=\"gspo\""],
                "estimator = \"gspo\" computes grpo's advantages; GSPO's sequence-level objective is algorithm.loss.policy = \"gspo\"",
            ),
            (
                &[
                    "algorithm.advantage.estimator=\"cispo\"",
                    "algorithm.loss.policy=\"gspo\"",
                ],
                "algorithm.loss.policy = \"cispo\": set it too",
            ),
            (&["rollout.max_rounds=3"], "fill filtered batches"),
            (
                &[
                    "trainer.mode=\"rollout_only\"",
                    "algorithm.advantage.estimator=\"ppo\"",
                ],
                "trains nothing",
            ),
        ];
        for (sets, expected) in cases {
            let e = parse(MIN, sets).unwrap_err();
            assert!(e.contains(expected), "{sets:?}: {e}");
        }
        let path = "[model]\npath = \"m\"\n[data]\npath = \"d.jsonl\"\n";
        let e = parse(path, &["data.task_size=10"]).unwrap_err();
        assert!(
            e.contains("data.task_size and data.task_seed apply to data.task"),
            "{e}"
        );
        // The same keys where they act are fine.
        parse(
            MIN,
            &[
                "data.shuffle=true",
                "data.seed=7",
                "trainer.decay=\"cosine\"",
                "trainer.min_lr_ratio=0.1",
            ],
        )
        .unwrap();
        parse(
            MIN,
            &["model.reference=\"r\"", "algorithm.loss.kl_loss_coef=0.01"],
        )
        .unwrap();
        parse(path, &["data.input_key=\"q\""]).unwrap();
        for name in ["gspo", "cispo"] {
            parse(
                MIN,
                &[
                    &format!("algorithm.advantage.estimator=\"{name}\""),
                    &format!("algorithm.loss.policy=\"{name}\""),
                ],
            )
            .unwrap();
        }
    }
}
