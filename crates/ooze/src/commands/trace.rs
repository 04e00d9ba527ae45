//! `--trace FILE` of the bench commands: PyTorch's profiler records the timed steps into a Chrome
//! trace (open it in Perfetto), and this module prints what a reader looks for first — how much of
//! the time the GPU was busy, the kernels that took it, and the longest gaps where the GPU waited
//! for the host (a synchronisation, a slow launch), named by the work either side.

use anyhow::Context;
use ooze_torch::profiler::Trace;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A `--trace` recording in progress, and where it goes.
pub(crate) struct Recording {
    trace: Trace,
    path: PathBuf,
}

impl Recording {
    /// Starts recording when `path` is given (`cuda`: the GPU's activity too).
    pub(crate) fn start(path: Option<&Path>, cuda: bool) -> anyhow::Result<Option<Recording>> {
        path.map(|path| {
            Ok(Recording {
                trace: Trace::start(cuda)?,
                path: path.to_owned(),
            })
        })
        .transpose()
    }

    /// Writes the trace and prints its summary over `steps` steps (`step` names what one is).
    pub(crate) fn finish(self, steps: usize, step: &str) -> anyhow::Result<()> {
        self.trace.finish(&self.path)?;
        eprint!("{}", GpuWork::load(&self.path)?.summary(steps, 25));
        eprintln!("trace written to {} (a step: {step})", self.path.display());
        Ok(())
    }
}

/// One complete event of a Chrome trace (Kineto writes times in microseconds).
#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    ph: String,
    #[serde(default)]
    cat: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    ts: f64,
    #[serde(default)]
    dur: f64,
}

#[derive(Deserialize)]
struct ChromeTrace {
    #[serde(rename = "traceEvents")]
    trace_events: Vec<Event>,
}

/// GPU work of a trace: kernels, copies and fills, as (name, start µs, duration µs) by start.
pub(crate) struct GpuWork {
    spans: Vec<(String, f64, f64)>,
}

/// Kernel names up to this many characters (template arguments make them long).
const NAME_WIDTH: usize = 110;

fn short_name(name: &str) -> String {
    let name = name.strip_prefix("void ").unwrap_or(name);
    if name.chars().count() <= NAME_WIDTH {
        name.to_string()
    } else {
        let cut: String = name.chars().take(NAME_WIDTH - 1).collect();
        format!("{cut}…")
    }
}

impl GpuWork {
    /// Reads the GPU events of the Chrome trace at `path`.
    pub(crate) fn load(path: &Path) -> anyhow::Result<GpuWork> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the trace {}", path.display()))?;
        let trace: ChromeTrace = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a Chrome trace (expected an object with traceEvents)",
                path.display()
            )
        })?;
        Ok(GpuWork::from_events(trace.trace_events))
    }

    fn from_events(events: Vec<Event>) -> GpuWork {
        let mut spans: Vec<(String, f64, f64)> = events
            .into_iter()
            .filter(|e| {
                e.ph == "X" && matches!(e.cat.as_str(), "kernel" | "gpu_memcpy" | "gpu_memset")
            })
            .map(|e| (e.name, e.ts, e.dur.max(0.0)))
            .collect();
        spans.sort_by(|a, b| a.1.total_cmp(&b.1));
        GpuWork { spans }
    }

    /// The summary over `steps` steps: busy share, kernels by time, the longest idle gaps.
    pub(crate) fn summary(&self, steps: usize, top: usize) -> String {
        let steps = steps.max(1) as f64;
        let Some(first) = self.spans.first() else {
            return "trace: no GPU activity recorded (a CPU run: open the trace in Perfetto)\n"
                .to_string();
        };
        let start = first.1;
        let (mut busy, mut covered_to) = (0.0f64, start);
        let mut gaps: Vec<(f64, usize)> = Vec::new();
        for (i, (_, ts, dur)) in self.spans.iter().enumerate() {
            let end = ts + dur;
            if *ts > covered_to {
                gaps.push((ts - covered_to, i));
            }
            busy += (end - ts.max(covered_to)).max(0.0);
            covered_to = covered_to.max(end);
        }
        let span = covered_to - start;
        let mut out = format!(
            "trace: {:.2} ms of GPU time per step, busy {:.2} ms ({:.1}%), idle {:.2} ms; {} GPU operations per step\n",
            span / steps / 1e3,
            busy / steps / 1e3,
            100.0 * busy / span.max(f64::MIN_POSITIVE),
            (span - busy) / steps / 1e3,
            (self.spans.len() as f64 / steps).round(),
        );
        let mut by_name: HashMap<&str, (f64, usize)> = HashMap::new();
        for (name, _, dur) in &self.spans {
            let entry = by_name.entry(name).or_default();
            entry.0 += dur;
            entry.1 += 1;
        }
        let mut kernels: Vec<_> = by_name.into_iter().collect();
        kernels.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        out.push_str("  ms/step  share  calls/step  kernel\n");
        for (name, (total, calls)) in kernels.iter().take(top) {
            out.push_str(&format!(
                "  {:7.3}  {:4.1}%  {:10.1}  {}\n",
                total / steps / 1e3,
                100.0 * total / busy.max(f64::MIN_POSITIVE),
                *calls as f64 / steps,
                short_name(name)
            ));
        }
        gaps.sort_by(|a, b| b.0.total_cmp(&a.0));
        if !gaps.is_empty() {
            out.push_str("  longest idle gaps (µs: after → before)\n");
        }
        for (gap, i) in gaps.iter().take(top.min(10)) {
            out.push_str(&format!(
                "  {:9.1}  {} → {}\n",
                gap,
                short_name(&self.spans[i - 1].0),
                short_name(&self.spans[*i].0)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(name: &str, ts: f64, dur: f64) -> Event {
        Event {
            ph: "X".into(),
            cat: "kernel".into(),
            name: name.into(),
            ts,
            dur,
        }
    }

    #[test]
    fn busy_time_is_the_union_of_overlapping_work_and_gaps_name_their_neighbours() {
        let mut events = vec![
            kernel("gemm", 0.0, 100.0),
            kernel("norm", 50.0, 100.0), // overlaps: busy until 150
            kernel("gemm", 400.0, 100.0),
            kernel("softmax", 520.0, 80.0),
        ];
        events.push(Event {
            ph: "X".into(),
            cat: "cpu_op".into(),
            name: "aten::mm".into(),
            ts: 0.0,
            dur: 1000.0,
        });
        let work = GpuWork::from_events(events);
        let s = work.summary(1, 5);
        // Span 0..600 µs; busy 150 + 100 + 80 = 330 µs.
        assert!(
            s.contains("0.60 ms of GPU time per step, busy 0.33 ms (55.0%), idle 0.27 ms"),
            "{s}"
        );
        assert!(s.contains("0.200  60.6%         2.0  gemm"), "{s}");
        let gap_lines: Vec<&str> = s.lines().skip_while(|l| !l.contains("gaps")).collect();
        assert!(gap_lines[1].contains("250.0  norm → gemm"), "{s}");
        assert!(gap_lines[2].contains("20.0  gemm → softmax"), "{s}");
        assert!(
            !s.contains("aten::mm"),
            "CPU operations are not GPU work: {s}"
        );
    }

    #[test]
    fn a_trace_without_gpu_work_says_so_and_a_bad_file_names_itself() {
        assert!(GpuWork::from_events(Vec::new())
            .summary(1, 5)
            .contains("no GPU activity"));
        let dir = std::env::temp_dir().join(format!("ooze-trace-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{\"events\": []}").unwrap();
        let err = format!("{:#}", GpuWork::load(&bad).err().unwrap());
        assert!(err.contains("bad.json is not a Chrome trace"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn long_names_are_cut() {
        let long = format!("void {}", "x".repeat(300));
        let short = short_name(&long);
        assert_eq!(short.chars().count(), NAME_WIDTH);
        assert!(short.ends_with('…') && !short.starts_with("void"));
    }
}
