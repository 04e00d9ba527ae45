//! Rows of `[algorithm]`, `[trainer]`, `[critic]` and `[teacher]`.

use super::{case, Case, Obs};
use super::{KL_LOSS as kl_loss, PPO as ppo, REFERENCE as reference, TWO_STEPS as two_steps};

pub fn cases() -> Vec<Case> {
    use Obs::*;
    let rpp = "algorithm.advantage.estimator=\"reinforce_plus_plus\"";
    vec![
        // [algorithm.advantage]
        case(
            &["algorithm.advantage.estimator"],
            &[],
            &["algorithm.advantage.estimator=\"rloo\""],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.std_normalization"],
            &[],
            &["algorithm.advantage.std_normalization=false"],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.gamma"],
            &[rpp],
            &[rpp, "algorithm.advantage.gamma=0.5"],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.lambda"],
            &[ppo],
            &[ppo, "algorithm.advantage.lambda=0.5"],
            Metric("train/grad_norm"),
        ),
        // The reference is the policy's start: the KL acts from the second rollout on.
        case(
            &["algorithm.advantage.kl_coef"],
            &[rpp, "rollout.num_rollouts=2", "trainer.lr=0.05"],
            &[
                rpp,
                "rollout.num_rollouts=2",
                "trainer.lr=0.05",
                "algorithm.advantage.kl_coef=0.5",
            ],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.kl_estimator"],
            &[rpp, reference, "algorithm.advantage.kl_coef=0.5"],
            &[
                rpp,
                reference,
                "algorithm.advantage.kl_coef=0.5",
                "algorithm.advantage.kl_estimator=\"k1\"",
            ],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.normalize_advantages"],
            &[],
            &["algorithm.advantage.normalize_advantages=true"],
            Metric("train/grad_norm"),
        ),
        case(
            &["algorithm.advantage.opd_coef", "teacher.path"],
            &[],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.path=\"{model2}\"",
            ],
            Metric("train/teacher_logp_gap"),
        ),
        case(
            &["algorithm.advantage.clip"],
            &[],
            &["algorithm.advantage.clip=0.01"],
            Metric("train/grad_norm"),
        ),
        // [algorithm.loss]
        case(
            &["algorithm.loss.policy"],
            &[],
            &["algorithm.loss.policy=\"cispo\""],
            Metric("train/policy_loss"),
        ),
        case(
            &["algorithm.loss.eps_low"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "algorithm.loss.eps_low=0.001",
            ],
            Metric("train/clipfrac"),
        ),
        // At trainer.lr = 1e-3 the first step moves the second group's ratios a little both
        // ways: some positive-advantage tokens pass 1.001 (clipped), some negative-advantage
        // ones pass the dual clip's 1.0001 (the loss capped).
        case(
            &["algorithm.loss.eps_high"],
            &two_steps[..2],
            &[two_steps[0], two_steps[1], "algorithm.loss.eps_high=0.001"],
            Metric("train/clipfrac"),
        ),
        case(
            &["algorithm.loss.dual_clip"],
            &two_steps[..2],
            &[
                two_steps[0],
                two_steps[1],
                "algorithm.loss.dual_clip=1.0001",
            ],
            Metric("train/policy_loss"),
        ),
        case(
            &["algorithm.loss.importance.mode"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\", low = 1.5}"],
            &["algorithm.loss.importance={level = \"token\", mode = \"mask\", low = 1.5}"],
            Metric("train/importance_weight"),
        ),
        // bf16: the engine's and the trainer's log-probs differ, so token and sequence weights do.
        case(
            &["algorithm.loss.importance.level"],
            &[
                "model.dtype=\"bf16\"",
                "algorithm.loss.importance={level = \"token\", mode = \"truncate\", high = 1.0}",
            ],
            &[
                "model.dtype=\"bf16\"",
                "algorithm.loss.importance={level = \"sequence\", mode = \"truncate\", high = 1.0}",
            ],
            Metric("train/importance_weight"),
        ),
        case(
            &["algorithm.loss.importance.low"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\"}"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\", low = 1.5}"],
            Metric("train/importance_weight"),
        ),
        case(
            &["algorithm.loss.importance.high"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\"}"],
            &["algorithm.loss.importance={level = \"token\", mode = \"truncate\", high = 0.5}"],
            Metric("train/importance_weight"),
        ),
        case(
            &["algorithm.loss.kl_loss_coef"],
            &[],
            &[kl_loss],
            Metric("train/kl"),
        ),
        case(
            &["algorithm.loss.kl_estimator"],
            &[kl_loss, reference],
            &[kl_loss, reference, "algorithm.loss.kl_estimator=\"k1\""],
            Metric("train/kl"),
        ),
        case(
            &["algorithm.loss.kl_unbiased"],
            &[kl_loss, reference, two_steps[0], two_steps[1], two_steps[2]],
            &[
                kl_loss,
                reference,
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "algorithm.loss.kl_unbiased=true",
            ],
            Metric("train/loss"),
        ),
        case(
            &["algorithm.loss.entropy_coef"],
            &[],
            &["algorithm.loss.entropy_coef=0.1"],
            Metric("train/loss"),
        ),
        case(
            &["algorithm.loss.value_coef"],
            &[ppo],
            &[ppo, "algorithm.loss.value_coef=0.5"],
            Metric("train/loss"),
        ),
        // The critic's clip is critic.value_clip; this one is refused, naming that.
        case(
            &["algorithm.loss.value_clip"],
            &[],
            &["algorithm.loss.value_clip=0.5"],
            Refused("critic.value_clip"),
        ),
        case(
            &["algorithm.aggregation"],
            &[],
            &["algorithm.aggregation=\"seq_mean_token_sum\""],
            Metric("train/grad_norm"),
        ),
        // [trainer]
        case(
            &["trainer.mode"],
            &[],
            &["trainer.mode=\"rollout_only\""],
            Metric("train/loss"),
        ),
        case(
            &["trainer.replay_from"],
            &[],
            &[
                "trainer.mode=\"replay\"",
                "trainer.replay_from=\"{base_run}\"",
                "rollout.seed=99",
            ],
            Replays,
        ),
        case(
            &["trainer.global_batch_size"],
            &[],
            &["trainer.global_batch_size=2"],
            Metric("train/steps"),
        ),
        case(&["trainer.lr"], &[], &["trainer.lr=0.05"], Weights),
        case(
            &["trainer.warmup_steps"],
            &[],
            &["trainer.warmup_steps=5"],
            Metric("train/lr"),
        ),
        case(
            &["trainer.decay"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.decay=\"linear\"",
            ],
            Metric("train/lr"),
        ),
        case(
            &["trainer.min_lr_ratio"],
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.decay=\"linear\"",
            ],
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.decay=\"linear\"",
                "trainer.min_lr_ratio=0.9",
            ],
            Metric("train/lr"),
        ),
        case(
            &["trainer.optimizer.beta1"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.optimizer.beta1=0.1",
            ],
            Weights,
        ),
        case(
            &["trainer.optimizer.beta2"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.optimizer.beta2=0.5",
            ],
            Weights,
        ),
        case(
            &["trainer.optimizer.eps"],
            &[],
            &["trainer.optimizer.eps=1.0"],
            Weights,
        ),
        case(
            &["trainer.optimizer.weight_decay"],
            &[],
            &["trainer.optimizer.weight_decay=0.5"],
            Weights,
        ),
        case(
            &["trainer.optimizer.clip_grad"],
            two_steps,
            &[
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "trainer.optimizer.clip_grad=1e-6",
            ],
            Weights,
        ),
        case(
            &["trainer.max_tokens_per_micro_batch"],
            &[],
            &["trainer.max_tokens_per_micro_batch=8"],
            Resource("peak activation memory (one sample per micro-batch)"),
        ),
        case(
            &["trainer.recompute_activations"],
            &[],
            &["trainer.recompute_activations=true"],
            Resource("activation memory (blocks recomputed in the backward pass)"),
        ),
        case(
            &["trainer.sharding"],
            &[],
            &["trainer.sharding=\"sharded\""],
            Resource(
                "how ranks hold the model (one rank here: whole; tests/ranks.rs trains sharded)",
            ),
        ),
        case(
            &["trainer.gpus"],
            &[],
            &["trainer.gpus=2"],
            Stderr("ranks: 2 joined over Gloo"),
        ),
        case(
            &["trainer.save_interval"],
            &["rollout.num_rollouts=2"],
            &["rollout.num_rollouts=2", "trainer.save_interval=1"],
            Entry("checkpoint-000001"),
        ),
        // [critic] (estimator = "ppo")
        case(
            &["critic.path"],
            &[ppo, two_steps[0], two_steps[1], two_steps[2]],
            &[
                ppo,
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "critic.path=\"{model2}\"",
            ],
            Metric("train/value_loss"),
        ),
        case(
            &["critic.lr"],
            &[ppo, two_steps[0], two_steps[1], two_steps[2]],
            &[
                ppo,
                two_steps[0],
                two_steps[1],
                two_steps[2],
                "critic.lr=0.5",
            ],
            Metric("train/value_loss"),
        ),
        // A small critic step moves the values by less than the default clip (0.2) and more
        // than 1e-4.
        case(
            &["critic.value_clip"],
            &[ppo, two_steps[0], two_steps[1], "critic.lr=1e-4"],
            &[
                ppo,
                two_steps[0],
                two_steps[1],
                "critic.lr=1e-4",
                "critic.value_clip=1e-4",
            ],
            Metric("train/value_clipfrac"),
        ),
        case(
            &["critic.warmup_steps"],
            &[ppo],
            &[ppo, "critic.warmup_steps=1"],
            Metric("train/policy_frozen_steps"),
        ),
        // [teacher] (algorithm.advantage.opd_coef); {teacher} serves the policy's own weights.
        case(
            &["teacher.url"],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.path=\"{model2}\"",
            ],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher={url = \"{teacher}\"}",
            ],
            Metric("train/teacher_logp_gap"),
        ),
        case(
            &["teacher.timeout_secs"],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.url=\"{teacher}\"",
            ],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.url=\"{teacher}\"",
                "teacher.timeout_secs=1e-6",
            ],
            Fails("teacher"),
        ),
        case(
            &["teacher.concurrency"],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.url=\"{teacher}\"",
            ],
            &[
                "algorithm.advantage.opd_coef=1.0",
                "teacher.url=\"{teacher}\"",
                "teacher.concurrency=1",
            ],
            Resource("teacher requests in flight"),
        ),
    ]
}
