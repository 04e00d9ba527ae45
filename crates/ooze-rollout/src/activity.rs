//! What a rollout's executions are doing over time: how many are alive, how many have a policy
//! turn in the engine, how many wait on a helper model (a judge, an expert, a simulated user).
//! The rest of the alive ones are in their tools or between calls.
//!
//! The seeds' τ-bench run asked for 256 concurrent trajectories and measured a median of 2
//! generating at once: the trajectories phase-lock (all wait on the user simulator, then all
//! generate). Nominal concurrency says nothing about that; the effective one, over time, does.
//! Every change of a count is logged with its time, so the summary's quantiles are exact
//! time-weighted ones, and the series is the count as it stood at each sampling instant.

use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What an execution is doing, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Alive: from its start to its end.
    Execution,
    /// A policy turn in the engine.
    Generating,
    /// Waiting on a helper model's reply.
    Helper,
}

#[derive(Debug, Default)]
struct Log {
    start: Option<Instant>,
    /// The counts now: alive, generating, helper.
    now: [u32; 3],
    /// Every change: seconds since `start`, the counts from then on.
    changes: Vec<(f64, [u32; 3])>,
}

/// The shared activity log of one rollout (cloning shares it).
#[derive(Debug, Clone, Default)]
pub struct Activity(Arc<Mutex<Log>>);

/// Counts `phase` as long as it lives.
#[must_use = "the phase is counted until the guard is dropped"]
pub struct PhaseGuard {
    activity: Activity,
    phase: Phase,
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        self.activity.change(self.phase, false);
    }
}

impl Activity {
    /// Starts a new log (at the start of a rollout; until the first, changes are counted but not
    /// logged); counts of phases still open carry over.
    pub fn restart(&self) {
        let mut log = self.0.lock().expect("never poisoned");
        let now = log.now;
        log.start = Some(Instant::now());
        log.changes = vec![(0.0, now)];
    }

    /// Counts `phase` until the returned guard is dropped.
    pub fn enter(&self, phase: Phase) -> PhaseGuard {
        self.change(phase, true);
        PhaseGuard {
            activity: self.clone(),
            phase,
        }
    }

    fn change(&self, phase: Phase, up: bool) {
        let mut log = self.0.lock().expect("never poisoned");
        let i = phase as usize;
        log.now[i] = if up {
            log.now[i] + 1
        } else {
            log.now[i].saturating_sub(1)
        };
        // Only a restarted log records its changes (contexts outside a rollout count, unread).
        if let Some(start) = log.start {
            let entry = (start.elapsed().as_secs_f64(), log.now);
            log.changes.push(entry);
        }
    }

    /// The log since the last [`Activity::restart`], up to now, with the series sampled every
    /// `every` seconds.
    pub fn summary(&self, every: f64) -> ActivitySummary {
        let log = self.0.lock().expect("never poisoned");
        let end = log.start.map_or(0.0, |s| s.elapsed().as_secs_f64());
        summarize(&log.changes, end, every)
    }
}

/// Time-weighted statistics of one count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CountStats {
    pub mean: f64,
    pub median: f64,
    pub p90: f64,
    pub max: f64,
}

/// A rollout's activity: statistics of each count and the counts over time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ActivitySummary {
    pub seconds: f64,
    pub alive: CountStats,
    pub generating: CountStats,
    pub helper: CountStats,
    /// Seconds between the series' samples.
    pub every: f64,
    /// `[alive, generating, helper]` at `0, every, 2·every, …`.
    pub series: Vec<[u32; 3]>,
}

fn summarize(changes: &[(f64, [u32; 3])], end: f64, every: f64) -> ActivitySummary {
    // How long each count held each value: the interval from a change to the next.
    let mut spans: [Vec<(u32, f64)>; 3] = Default::default();
    for (k, &(t, counts)) in changes.iter().enumerate() {
        let until = changes.get(k + 1).map_or(end, |c| c.0).max(t);
        for (i, spans) in spans.iter_mut().enumerate() {
            spans.push((counts[i], until - t));
        }
    }
    let stats = |spans: &mut Vec<(u32, f64)>| {
        let total: f64 = spans.iter().map(|s| s.1).sum();
        if total <= 0.0 {
            let max = spans.iter().map(|s| s.0).max().unwrap_or(0) as f64;
            return CountStats {
                max,
                ..CountStats::default()
            };
        }
        let mean = spans.iter().map(|&(v, d)| v as f64 * d).sum::<f64>() / total;
        let max = spans
            .iter()
            .filter(|s| s.1 > 0.0)
            .map(|s| s.0)
            .max()
            .unwrap_or(0) as f64;
        spans.sort_by_key(|s| s.0);
        let quantile = |q: f64| {
            let mut acc = 0.0;
            for &(v, d) in spans.iter() {
                acc += d;
                if acc >= q * total {
                    return v as f64;
                }
            }
            max
        };
        CountStats {
            mean,
            median: quantile(0.5),
            p90: quantile(0.9),
            max,
        }
    };
    let mut series = Vec::new();
    if every > 0.0 && !changes.is_empty() {
        let mut k = 0;
        let mut t = 0.0;
        while t <= end {
            while k + 1 < changes.len() && changes[k + 1].0 <= t {
                k += 1;
            }
            series.push(changes[k].1);
            t = series.len() as f64 * every;
        }
    }
    let [mut alive, mut generating, mut helper] = spans;
    ActivitySummary {
        seconds: end,
        alive: stats(&mut alive),
        generating: stats(&mut generating),
        helper: stats(&mut helper),
        every,
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_weighted_by_time() {
        // 0 generating for 1 s, 4 for 3 s, 1 for 6 s.
        let changes = [(0.0, [8, 0, 0]), (1.0, [8, 4, 2]), (4.0, [8, 1, 0])];
        let s = summarize(&changes, 10.0, 2.5);
        // Sorted by value: 0 for 1 s, 1 for 6 s, 4 for 3 s.
        assert_eq!(s.generating.median, 1.0);
        assert_eq!(s.generating.p90, 4.0);
        assert_eq!(s.generating.max, 4.0);
        assert!((s.generating.mean - (4.0 * 3.0 + 6.0) / 10.0).abs() < 1e-12);
        assert!((s.helper.mean - 0.6).abs() < 1e-12);
        assert_eq!(s.alive.median, 8.0);
        // Samples at 0, 2.5, 5, 7.5, 10.
        assert_eq!(
            s.series,
            vec![[8, 0, 0], [8, 4, 2], [8, 1, 0], [8, 1, 0], [8, 1, 0]]
        );
        // Mostly 4: the median follows the time, not the number of changes.
        let changes = [(0.0, [1, 4, 0]), (9.0, [1, 0, 0]), (9.5, [1, 1, 0])];
        let s = summarize(&changes, 10.0, 0.0);
        assert_eq!((s.generating.median, s.generating.p90), (4.0, 4.0));
        assert!(s.series.is_empty());
    }

    #[test]
    fn guards_count_while_they_live() {
        let a = Activity::default();
        a.restart();
        let alive = [a.enter(Phase::Execution), a.enter(Phase::Execution)];
        {
            let _g = a.enter(Phase::Generating);
            assert_eq!(a.0.lock().unwrap().now, [2, 1, 0]);
        }
        let h = a.enter(Phase::Helper);
        assert_eq!(a.0.lock().unwrap().now, [2, 0, 1]);
        drop(alive);
        drop(h);
        assert_eq!(a.0.lock().unwrap().now, [0, 0, 0]);
        let s = a.summary(0.0);
        assert!(s.generating.max <= 1.0 && s.alive.max <= 2.0, "{s:?}");
        // A restart keeps what is still open and forgets the history.
        let _g = a.enter(Phase::Execution);
        a.restart();
        assert_eq!(a.0.lock().unwrap().changes, vec![(0.0, [1, 0, 0])]);
    }
}
