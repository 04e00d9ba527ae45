//! The table: for every key the recipe parser accepts, a non-default value and what it changes.
//! Keys of a tagged section are written `reward(TYPE).key` / `agent(TYPE).key`; the helpers'
//! table `helpers.NAME.key`; the command agent's variables `agent(command).env.NAME`; eval sets
//! `eval.datasets[].key`.

mod inputs;
mod outputs;
mod training;

/// What a case's run shows against its base run.
#[derive(Debug, Clone)]
pub enum Obs {
    /// The metric's series over metrics.jsonl differs (value or presence).
    Metric(&'static str),
    /// The saved samples (response ids, log-probs, rewards) differ.
    Responses,
    /// The agent's turns differ: each saved sample's own prompt and response tokens (no
    /// floating-point numbers, which tool timing can move through the engine's batching).
    Turns,
    /// The metric's series differs by more than this somewhere (rewards that include a measured
    /// latency move a little from run to run).
    MetricBeyond(&'static str, f64),
    /// The saved prompts (text, ids, label, metadata) or their order differ.
    Prompts,
    /// The final weights differ.
    Weights,
    /// This run-directory entry is present in one run and absent in the other.
    Entry(&'static str),
    /// The case's stderr has this text and the base's has not.
    Stderr(&'static str),
    /// The case fails with this text; the base succeeds.
    Fails(&'static str),
    /// The base fails with this text; the case succeeds.
    Rescues(&'static str),
    /// The recipe is refused when parsed, naming this (no run): keys that cannot act here.
    Refused(&'static str),
    /// Replays the base run's rollouts (`{base_run}`): the base's weights, not what its own
    /// sampling settings would give.
    Replays,
    /// The run directory is where the key says.
    RunDir(&'static str),
    /// Resource knobs: the numbers equal the base's (asserted) and the effect is the text's,
    /// which a CPU run cannot show.
    Resource(&'static str),
}

pub struct Case {
    pub keys: Vec<String>,
    pub base: Vec<String>,
    pub sets: Vec<String>,
    pub obs: Obs,
}

/// Two optimizer steps of 4 samples each at a large learning rate: the second step's ratios move.
pub const TWO_STEPS: &[&str] = &[
    "rollout.n_samples_per_prompt=4",
    "trainer.global_batch_size=4",
    "trainer.lr=0.05",
];
pub const PPO: &str = "algorithm.advantage.estimator=\"ppo\"";
pub const KL_LOSS: &str = "algorithm.loss.kl_loss_coef=0.5";
pub const REFERENCE: &str = "model.reference=\"{model2}\"";

fn strings(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|s| s.to_string()).collect()
}

fn case(keys: &[&str], base: &[&str], sets: &[&str], obs: Obs) -> Case {
    Case {
        keys: strings(keys),
        base: strings(base),
        sets: strings(sets),
        obs,
    }
}

pub fn cases() -> Vec<Case> {
    let mut c = inputs::cases();
    c.extend(training::cases());
    c.extend(outputs::cases());
    c.extend(super::agent_cases::cases());
    c
}
