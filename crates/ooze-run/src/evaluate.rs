//! Stage *evaluate*: the held-out eval sets through the engine (or the agent) under the current
//! weights — before the first rollout of a fresh run (`eval.at_start`), every `eval.interval`
//! rollouts and after the last — with seeds that do not change between evaluations, so two
//! evaluations differ only by the weights.

use crate::eval::{evaluate, EvalResult};
use crate::run::Run;
use serde_json::{json, Map, Value};
use std::time::Instant;

impl Run {
    /// Stage *evaluate*: every eval set through the engine (or the agent) under the current
    /// weights, with seeds that do not change between evaluations.
    /// On several ranks, rank 0 evaluates alone (the others have no results).
    pub(crate) fn evaluate(&self) -> anyhow::Result<Vec<EvalResult>> {
        if !self.is_first() {
            return Ok(Vec::new());
        }
        let r = &self.recipe.rollout;
        let seed = r.seed ^ 0xe7a1;
        let mut out = Vec::new();
        for set in &self.evals {
            let t = Instant::now();
            let result = self.runtime.block_on(evaluate(
                self.engine()?,
                &self.tokenizer,
                set,
                r.concurrency,
                seed,
                self.settings.agent.as_ref(),
            ))?;
            eprintln!(
                "eval {}: {} ({} prompts × {}, {:.1}s)",
                set.name,
                result
                    .pass_at
                    .iter()
                    .map(|(k, v)| format!("pass@{k} {v:.3}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                set.prompts.len(),
                set.n_samples,
                t.elapsed().as_secs_f64()
            );
            out.push(result);
        }
        Ok(out)
    }

    /// Evaluates before the first rollout of a fresh run (`eval.at_start`).
    pub(crate) fn evaluate_at_start(&mut self) -> anyhow::Result<()> {
        if self.state.rollout != 0 || !self.recipe.eval.at_start || self.evals.is_empty() {
            return Ok(());
        }
        self.first_eval = self.evaluate()?;
        let mut line = Map::new();
        line.insert("rollout".into(), json!(0));
        eval_line(&self.first_eval, &mut line);
        if let Some(log) = self.log.as_mut() {
            log.write(&line)?;
        }
        self.last_eval = self.first_eval.clone();
        Ok(())
    }

    /// Evaluates after rollout `index` when it is the last or a multiple of `eval.interval`.
    pub(crate) fn evaluate_when_due(
        &mut self,
        index: u64,
        line: &mut Map<String, Value>,
    ) -> anyhow::Result<()> {
        let interval = self.recipe.eval.interval;
        let total = self.recipe.rollout.num_rollouts;
        if !self.evals.is_empty()
            && (index == total || (interval > 0 && index.is_multiple_of(interval)))
        {
            self.last_eval = self.evaluate()?;
            eval_line(&self.last_eval, line);
        }
        Ok(())
    }
}

/// Adds eval results to a metrics line: `eval/NAME/pass@K` and `eval/NAME/response_len`.
pub(crate) fn eval_line(results: &[EvalResult], line: &mut Map<String, Value>) {
    for e in results {
        for (k, v) in &e.pass_at {
            line.insert(format!("eval/{}/pass@{k}", e.name), json!(v));
        }
        line.insert(
            format!("eval/{}/response_len", e.name),
            json!(e.mean_response_tokens),
        );
    }
}
