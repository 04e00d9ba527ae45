//! The HTML report of a run: PNG plots of the metrics in `metrics.jsonl` (reward, eval pass@k, KL,
//! entropy, response length, clip fraction, the train-vs-rollout log-prob mismatch, step times),
//! the last values, and the recipe. Written at the end of `ooze train` and by `ooze report RUN`.

use crate::plot::{line_plot, Series, COLORS};
use anyhow::Context;
use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The plots: a title and the metric keys drawn in it (a key ending in `*` takes every key with
/// that prefix).
const PLOTS: &[(&str, &str, &[&str])] = &[
    (
        "reward",
        "Rollout reward (mean over samples)",
        &["reward/mean"],
    ),
    ("eval", "Held-out pass@k", &["eval/*"]),
    ("kl", "KL to the reference", &["train/kl"]),
    ("entropy", "Policy entropy (per token)", &["train/entropy"]),
    (
        "length",
        "Response length (tokens)",
        &["rollout/response_len_mean", "rollout/response_len_max"],
    ),
    (
        "clipfrac",
        "Clipped fraction of tokens",
        &["train/clipfrac"],
    ),
    (
        "mismatch",
        "|trainer − rollout engine| log-prob per token",
        &["train/mismatch_mean", "train/mismatch_max"],
    ),
    (
        "time",
        "Seconds per rollout",
        &["time/rollout", "time/train", "time/weight_sync"],
    ),
];

/// A series' points: (rollout, value).
type Points = Vec<(f64, Option<f64>)>;

/// Reads `RUN/metrics.jsonl` (lines that are not JSON objects are reported with their number).
pub fn read_metrics(run_dir: &Path) -> anyhow::Result<Vec<Map<String, Value>>> {
    let path = run_dir.join("metrics.jsonl");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) => Ok(m),
            _ => anyhow::bail!("{}:{}: not a JSON object", path.display(), i + 1),
        })
        .collect()
}

fn keys_for(lines: &[Map<String, Value>], pattern: &str) -> Vec<String> {
    match pattern.strip_suffix('*') {
        Some(prefix) => {
            let mut keys: Vec<String> = Vec::new();
            for l in lines {
                for k in l.keys() {
                    if k.starts_with(prefix) && k.contains("pass@") && !keys.contains(k) {
                        keys.push(k.clone());
                    }
                }
            }
            keys
        }
        None => vec![pattern.to_owned()],
    }
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Writes `RUN/report.html` and `RUN/plots/*.png`; returns the report's path.
pub fn write_report(run_dir: &Path) -> anyhow::Result<PathBuf> {
    let lines = read_metrics(run_dir)?;
    let plots_dir = run_dir.join("plots");
    std::fs::create_dir_all(&plots_dir)?;
    let mut html = String::new();
    let title = run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let _ = write!(
        html,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>ooze run {t}</title>\
         <style>body{{font-family:sans-serif;max-width:700px;margin:2em auto;color:#222}}\
         td,th{{padding:2px 10px;text-align:right}} .k{{text-align:left}} pre{{background:#f6f6f6;padding:1em;overflow:auto}}</style>\
         </head><body><h1>ooze run {t}</h1>",
        t = html_escape(&title)
    );
    let rollouts = lines
        .iter()
        .filter_map(|l| l.get("rollout").and_then(Value::as_u64))
        .max()
        .unwrap_or(0);
    let _ = write!(
        html,
        "<p>{rollouts} rollouts, {} metric lines.</p>",
        lines.len()
    );
    for (file, heading, patterns) in PLOTS {
        let keys: Vec<String> = patterns.iter().flat_map(|p| keys_for(&lines, p)).collect();
        let series: Vec<(String, Points)> = keys
            .iter()
            .map(|k| {
                let points = lines
                    .iter()
                    .filter_map(|l| {
                        let x = l.get("rollout")?.as_f64()?;
                        Some((x, l.get(k).and_then(Value::as_f64)))
                    })
                    .filter(|(_, y)| y.is_some())
                    .collect();
                (k.clone(), points)
            })
            .filter(|(_, p): &(String, Vec<_>)| !p.is_empty())
            .collect();
        let _ = write!(html, "<h2>{}</h2>", html_escape(heading));
        if series.is_empty() {
            html.push_str("<p><i>not recorded in this run</i></p>");
            continue;
        }
        let png = line_plot(
            &series
                .iter()
                .map(|(_, p)| Series { points: p })
                .collect::<Vec<_>>(),
        );
        let png_path = plots_dir.join(format!("{file}.png"));
        std::fs::write(&png_path, png)
            .with_context(|| format!("writing {}", png_path.display()))?;
        let _ = write!(
            html,
            "<img src=\"plots/{file}.png\" width=\"640\" height=\"300\" alt=\"{}\"><table><tr><th class=k>series (x: rollout)</th><th>first</th><th>last</th><th>min</th><th>max</th></tr>",
            html_escape(heading)
        );
        for (i, (key, points)) in series.iter().enumerate() {
            let ys: Vec<f64> = points.iter().filter_map(|p| p.1).collect();
            let [r, g, b] = COLORS[i % COLORS.len()];
            let f = |v: f64| format!("{v:.4}");
            let _ = write!(
                html,
                "<tr><td class=k><span style=\"color:rgb({r},{g},{b})\">■</span> {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                html_escape(key),
                f(ys[0]),
                f(ys[ys.len() - 1]),
                f(ys.iter().cloned().fold(f64::MAX, f64::min)),
                f(ys.iter().cloned().fold(f64::MIN, f64::max)),
            );
        }
        html.push_str("</table>");
    }
    if let Ok(recipe) = std::fs::read_to_string(run_dir.join("recipe.toml")) {
        let _ = write!(html, "<h2>Recipe</h2><pre>{}</pre>", html_escape(&recipe));
    }
    html.push_str("</body></html>\n");
    let path = run_dir.join("report.html");
    ooze_train::checkpoint::write_atomic(&path, html.as_bytes())?;
    Ok(path)
}
