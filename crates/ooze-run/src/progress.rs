//! Console progress: on a terminal, a bar redrawn in place while samples finish; elsewhere (logs,
//! CI) nothing until the rollout's summary line. A rank started by `--nproc-per-node` writes to its
//! launcher through a pipe; the launcher says in [`STDERR_IS_TERMINAL`] when that reaches a
//! terminal.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Set (to `1`) in a rank's environment by a launcher whose standard error is a terminal, which
/// relays the rank's standard error to it.
pub const STDERR_IS_TERMINAL: &str = "OOZE_STDERR_IS_TERMINAL";

fn stderr_reaches_terminal() -> bool {
    std::io::stderr().is_terminal()
        || std::env::var_os(STDERR_IS_TERMINAL).is_some_and(|v| v == "1")
}

pub struct Progress {
    label: String,
    total: AtomicUsize,
    done: AtomicUsize,
    enabled: bool,
    last: Mutex<Option<Instant>>,
    started: Instant,
}

impl Progress {
    pub fn new(label: String, total: usize, enabled: bool) -> Progress {
        Progress {
            label,
            total: AtomicUsize::new(total),
            done: AtomicUsize::new(0),
            enabled: enabled && stderr_reaches_terminal(),
            last: Mutex::new(None),
            started: Instant::now(),
        }
    }

    /// One more sample finished (the total grows when over-sampling needs more).
    pub fn tick(&self) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        if done > self.total.load(Ordering::Relaxed) {
            self.total.store(done, Ordering::Relaxed);
        }
        if !self.enabled {
            return;
        }
        let mut last = self.last.lock().expect("invariant: not poisoned");
        if last.is_some_and(|t| t.elapsed().as_millis() < 100) {
            return;
        }
        *last = Some(Instant::now());
        let total = self.total.load(Ordering::Relaxed).max(1);
        let width = 30;
        let filled = (done * width / total).min(width);
        let rate = done as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
        eprint!(
            "\r\x1b[2K{} [{}{}] {done}/{total} samples, {rate:.0}/s",
            self.label,
            "#".repeat(filled),
            "-".repeat(width - filled)
        );
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if self.enabled {
            eprint!("\r\x1b[2K");
        }
    }
}
