//! Rows of `[eval]` and `[logging]`.

use super::{case, Case, Obs};

pub fn cases() -> Vec<Case> {
    use Obs::*;
    let eval = |extra: &str| {
        format!("eval.datasets=[{{name = \"held\", task = \"addition\", task_size = 16{extra}}}]")
    };
    vec![
        // [eval]
        case(
            &["eval.interval"],
            &["rollout.num_rollouts=2", &eval("")],
            &["rollout.num_rollouts=2", &eval(""), "eval.interval=1"],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.at_start"],
            &[&eval("")],
            &[&eval(""), "eval.at_start=false"],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].name"],
            &[&eval("")],
            &[&eval("").replace("held", "other")],
            Metric("eval/other/pass@1"),
        ),
        case(
            &["eval.datasets[].task"],
            &[&eval("")],
            &[&eval("").replace("\"addition\"", "\"repeat\"")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].task_size"],
            &[&eval("")],
            &[&eval("").replace("16", "5")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].task_seed"],
            &[&eval("")],
            &[&eval(", task_seed = 3")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].path"],
            &[&eval("")],
            &["eval.datasets=[{name = \"held\", path = \"{data}\"}]"],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].n_samples"],
            &[&eval("")],
            &[&eval(", n_samples = 3")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].temperature"],
            &[&eval("")],
            &[&eval(", temperature = 0.3")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].top_p"],
            &[&eval("")],
            &[&eval(", top_p = 0.05")],
            Metric("eval/held/pass@1"),
        ),
        case(
            &["eval.datasets[].max_new_tokens"],
            &[&eval("")],
            &[&eval(", max_new_tokens = 2")],
            Metric("eval/held/response_len"),
        ),
        case(
            &["eval.datasets[].pass_k"],
            &[&eval(", n_samples = 2")],
            &[&eval(", n_samples = 2, pass_k = [2]")],
            Metric("eval/held/pass@2"),
        ),
        // [logging]
        case(
            &["logging.run_dir"],
            &[],
            &["logging.run_dir=\"{dir}/elsewhere\""],
            RunDir("{dir}/elsewhere"),
        ),
        case(
            &["logging.tensorboard"],
            &[],
            &["logging.tensorboard=true"],
            Entry("tensorboard"),
        ),
        case(
            &["logging.save_rollouts"],
            &[],
            &["logging.save_rollouts=false"],
            Entry("rollouts"),
        ),
        case(
            &["logging.report"],
            &[],
            &["logging.report=true"],
            Entry("report.html"),
        ),
        case(
            &["logging.progress"],
            &[],
            &["logging.progress=true"],
            Stderr("1/1"),
        ),
    ]
}
