//! One episode: a persistent shell in its own container, commands with timeouts and capped
//! output, files in and out, and what it cost.
//!
//! The shell is two bash processes. The outer one (the sandbox's PID 2) starts the inner one and
//! starts it again whenever it ends. The inner one reads NUL-terminated commands from a pipe, runs
//! each with `eval` (so `cd` and `export` persist, as at a terminal) with stdin from `/dev/null`
//! and stdout and stderr to ooze's output pipe, saves its exported variables and directory, and
//! writes `S <status>` to a third pipe that commands cannot write to. When a command runs past
//! its timeout or floods its output, ooze kills every process of the episode except the sandbox's
//! init and the outer shell; the outer shell writes `R <status>`, waits for ooze's go-ahead (an
//! empty command, sent once the kill is over, so a new shell is never caught by it) and starts a
//! new inner shell, which restores the saved variables and directory. Background processes (a server a task
//! starts) live on between commands; the episode's end kills them all.
//!
//! Output is kept up to [`EpisodeLimits::output_bytes`]: its first and last halves, with the
//! number of bytes cut between them, so the end of a long test log (where the failure is) is
//! seen. Every way a command can end is in [`CommandOutput`], and
//! [`CommandOutput::observation`] turns it into the text a model is shown.

use crate::cgroup::EpisodeCgroup;
use crate::error::EnvError;
use crate::files;
use crate::launch::{Launch, Layout};
use crate::sandbox::{EpisodeLimits, Sandbox};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

/// How long an episode may take to start, and a stopped command's shell to come back.
const START_LIMIT: Duration = Duration::from_secs(20);
const RESTART_LIMIT: Duration = Duration::from_secs(5);

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It finished with this exit status (128 + N when signal N ended it).
    Exited(i32),
    /// Still running at its timeout: stopped, and the shell restarted.
    TimedOut,
    /// More output than [`EpisodeLimits::flood_bytes`]: stopped, and the shell restarted.
    Flooded,
    /// The command ended the shell (`exit`, `exec`, a signal); a new one was started.
    ShellExited(i32),
    /// The episode itself is gone (its shell and init were killed); no more commands run.
    EpisodeEnded,
}

/// What one command did.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandOutput {
    /// stdout and stderr as they interleaved, cut to the limit (first and last halves).
    pub output: String,
    /// Bytes the command wrote in all.
    pub output_bytes: u64,
    pub ending: Ending,
    pub duration: Duration,
    pub timeout: Duration,
    /// Processes the OOM killer ended during the command.
    pub oom_kills: u64,
    /// Forks refused at the episode's process limit during the command.
    pub forks_refused: u64,
    /// The writable layer was full when the command ended.
    pub disk_full: bool,
    /// The limits it ran under, for the observation.
    pub memory_limit: u64,
    pub process_limit: u64,
    pub disk_limit: u64,
}

impl CommandOutput {
    /// The exit status, when the command finished by itself.
    pub fn exit_code(&self) -> Option<i32> {
        match self.ending {
            Ending::Exited(code) => Some(code),
            _ => None,
        }
    }

    pub fn success(&self) -> bool {
        self.ending == Ending::Exited(0)
    }

    /// The output, then one line per thing that went wrong.
    pub fn observation(&self) -> String {
        let mut out = self.output.clone();
        let mut notes = Vec::new();
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        match self.ending {
            Ending::Exited(0) => {}
            Ending::Exited(code) => notes.push(format!("[exit code {code}]")),
            Ending::TimedOut => notes.push(format!(
                "[TIMEOUT: still running after {:.1} s, stopped; the shell was restarted with the \
                 environment and directory from before the command]",
                self.timeout.as_secs_f64()
            )),
            Ending::Flooded => notes.push(format!(
                "[OUTPUT FLOOD: {:.1} MiB of output, stopped; the shell was restarted]",
                mib(self.output_bytes)
            )),
            Ending::ShellExited(code) => notes.push(format!(
                "[the shell exited with status {code}; a new one was started]"
            )),
            Ending::EpisodeEnded => {
                notes.push("[the episode ended: its processes were all killed]".into())
            }
        }
        if self.oom_kills > 0 {
            notes.push(format!(
                "[OUT OF MEMORY: {} process(es) killed at the {:.0} MiB limit]",
                self.oom_kills,
                mib(self.memory_limit)
            ));
        }
        if self.forks_refused > 0 {
            notes.push(format!(
                "[PROCESS LIMIT: {} fork(s) refused at the limit of {} processes]",
                self.forks_refused, self.process_limit
            ));
        }
        if self.disk_full {
            notes.push(format!(
                "[DISK FULL: the episode's {:.0} MiB of writable space is used up]",
                mib(self.disk_limit)
            ));
        }
        if !notes.is_empty() {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&notes.join("\n"));
        }
        out
    }
}

/// What an episode cost.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EpisodeReport {
    /// From the start request to the shell's first answer.
    pub start: Duration,
    /// Most memory in use at once (all processes and the writable layer), where a memory cgroup
    /// measures it.
    pub memory_peak_bytes: Option<u64>,
    pub commands: u64,
    pub timeouts: u64,
    pub shell_restarts: u64,
    pub lifetime: Duration,
}

/// The first and last halves of a stream, and how much was cut between them.
struct Capture {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    half: usize,
    total: u64,
}

impl Capture {
    fn new(limit: usize) -> Capture {
        Capture {
            head: Vec::new(),
            tail: Default::default(),
            half: limit / 2,
            total: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.half.saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        let rest = &rest[rest.len().saturating_sub(self.half)..];
        let overflow = (self.tail.len() + rest.len()).saturating_sub(self.half);
        self.tail.drain(..overflow.min(self.tail.len()));
        self.tail.extend(rest);
    }

    fn text(&self) -> String {
        let kept = self.head.len() + self.tail.len();
        let mut bytes = self.head.clone();
        if self.total > kept as u64 {
            bytes.extend_from_slice(
                format!(
                    "\n[... {} bytes of output cut ...]\n",
                    self.total - kept as u64
                )
                .as_bytes(),
            );
        }
        bytes.extend(self.tail.iter());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// A running episode. Dropping it kills everything in it; [`Episode::close`] also reports.
pub struct Episode {
    sandbox: Sandbox,
    launch: Launch,
    child: Option<Child>,
    stdin: pipe::Sender,
    output: pipe::Receiver,
    status: pipe::Receiver,
    status_buf: Vec<u8>,
    /// The sandbox's PID 1, as the host sees it (containers).
    init_pid: Option<i32>,
    cgroup: Option<EpisodeCgroup>,
    limits: EpisodeLimits,
    report: EpisodeReport,
    born: Instant,
    ended: Option<String>,
}

/// A status line from the shell.
#[derive(Clone, Copy)]
enum Status {
    Done(i32),
    Restarted(i32),
    Gone,
}

impl Episode {
    pub(crate) async fn start(
        sandbox: Sandbox,
        launch: Launch,
        cgroup: Option<EpisodeCgroup>,
        limits: EpisodeLimits,
    ) -> Result<Episode, EnvError> {
        let born = Instant::now();
        let started = launch
            .start(cgroup.as_ref())
            .map_err(EnvError::io("starting the episode"))?;
        let receiver = |fd: OwnedFd| {
            pipe::Receiver::from_owned_fd(fd).map_err(EnvError::io("the episode's pipes"))
        };
        let mut episode = Episode {
            stdin: pipe::Sender::from_owned_fd(started.pipes.stdin)
                .map_err(EnvError::io("the episode's pipes"))?,
            output: receiver(started.pipes.output)?,
            status: receiver(started.pipes.status)?,
            status_buf: Vec::new(),
            child: Some(started.child),
            init_pid: None,
            sandbox,
            launch,
            cgroup,
            limits,
            report: EpisodeReport::default(),
            born,
            ended: None,
        };
        if let Some(info) = started.pipes.info {
            let info = receiver(info)?;
            if let Ok(text) = tokio::time::timeout(START_LIMIT, read_all(info)).await {
                episode.init_pid = child_pid(&text);
            }
            if episode.init_pid.is_none() {
                let said = episode.drain_output(1 << 12).await;
                return Err(EnvError::Episode(format!(
                    "bubblewrap did not start the sandbox: {}",
                    said.trim()
                )));
            }
        }
        let _slot = episode.slot().await;
        let first = episode.run_started(":", START_LIMIT).await?;
        if first.ending != Ending::Exited(0) {
            return Err(EnvError::Episode(format!(
                "the shell did not start: {}",
                first.observation().trim()
            )));
        }
        episode.report.commands = 0;
        episode.report.start = born.elapsed();
        Ok(episode)
    }

    async fn slot(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.sandbox
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("invariant: the semaphore is never closed")
    }

    /// Runs `command` in the shell, waiting for a free slot first; `timeout` (else the sandbox's)
    /// counts from the start. Errors only when the episode has already ended or the command has a
    /// NUL byte; every way the command itself ends is in the output.
    pub async fn run(
        &mut self,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<CommandOutput, EnvError> {
        if let Some(why) = &self.ended {
            return Err(EnvError::Episode(format!("the episode has ended: {why}")));
        }
        if command.contains('\0') {
            return Err(EnvError::Episode(
                "a command cannot contain a NUL byte".into(),
            ));
        }
        let _slot = self.slot().await;
        self.run_started(command, timeout.unwrap_or(self.limits.command_timeout))
            .await
    }

    async fn run_started(
        &mut self,
        command: &str,
        timeout: Duration,
    ) -> Result<CommandOutput, EnvError> {
        let before = (self.oom_kills(), self.forks_refused());
        let started = Instant::now();
        let mut framed = command.as_bytes().to_vec();
        framed.push(0);
        if self.stdin.write_all(&framed).await.is_err() {
            self.ended = Some("its shell no longer reads commands".into());
        }
        let mut capture = Capture::new(self.limits.output_bytes);
        let mut buf = vec![0u8; 64 << 10];
        let mut deadline = tokio::time::Instant::now() + timeout;
        let mut stopped: Option<Ending> = None;
        let status = loop {
            if self.ended.is_some() {
                break Status::Gone;
            }
            match self.take_status_line() {
                // After a stop, the status that counts is the restart's.
                Some(Status::Done(_)) if stopped.is_some() => continue,
                Some(status) => break status,
                None => {}
            }
            tokio::select! {
                biased;
                read = self.status.readable() => {
                    if read.is_ok() && !self.read_status() {
                        break Status::Gone;
                    }
                }
                read = self.output.read(&mut buf) => match read {
                    Ok(0) | Err(_) => {
                        // The output pipe closed: only a dead episode does that; the status pipe
                        // says so next.
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Ok(n) => {
                        capture.push(&buf[..n]);
                        if stopped.is_none() && capture.total > self.limits.flood_bytes {
                            stopped = Some(Ending::Flooded);
                            self.stop_command();
                            deadline = tokio::time::Instant::now() + RESTART_LIMIT;
                        }
                    }
                },
                _ = tokio::time::sleep_until(deadline) => {
                    if stopped.is_some() {
                        // The shell did not come back: the episode is unusable.
                        self.ended = Some("its shell did not restart after a stopped command".into());
                        break Status::Gone;
                    }
                    stopped = Some(Ending::TimedOut);
                    self.stop_command();
                    deadline = tokio::time::Instant::now() + RESTART_LIMIT;
                }
            }
        };
        // Whatever the command wrote is in the pipe by now.
        loop {
            match self.output.try_read(&mut buf) {
                Ok(n) if n > 0 => capture.push(&buf[..n]),
                _ => break,
            }
        }
        let ending = match (status, stopped) {
            (Status::Gone, _) => {
                self.ended
                    .get_or_insert_with(|| "its processes were all killed".into());
                Ending::EpisodeEnded
            }
            (_, Some(stop)) => stop,
            (Status::Restarted(code), None) => Ending::ShellExited(code),
            (Status::Done(code), None) => Ending::Exited(code),
        };
        if let Status::Restarted(_) = status {
            // The outer shell waits for this before it starts a new inner one.
            if self.stdin.write_all(&[0]).await.is_err() {
                self.ended = Some("its shell no longer reads commands".into());
            }
        }
        self.report.commands += 1;
        if ending == Ending::TimedOut {
            self.report.timeouts += 1;
        }
        if matches!(
            ending,
            Ending::TimedOut | Ending::Flooded | Ending::ShellExited(_)
        ) {
            self.report.shell_restarts += 1;
        }
        let after = (self.oom_kills(), self.forks_refused());
        Ok(CommandOutput {
            output: capture.text(),
            output_bytes: capture.total,
            ending,
            duration: started.elapsed(),
            timeout,
            oom_kills: after.0.saturating_sub(before.0),
            forks_refused: after.1.saturating_sub(before.1),
            disk_full: self.disk_full(),
            memory_limit: self.limits.memory_bytes,
            process_limit: self.limits.processes,
            disk_limit: self.limits.disk_bytes,
        })
    }

    /// Reads what the status pipe has; false at its end.
    fn read_status(&mut self) -> bool {
        let mut buf = [0u8; 256];
        loop {
            match self.status.try_read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => self.status_buf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
    }

    fn take_status_line(&mut self) -> Option<Status> {
        let end = self.status_buf.iter().position(|&b| b == b'\n')?;
        let line: Vec<u8> = self.status_buf.drain(..=end).collect();
        let line = String::from_utf8_lossy(&line);
        let code = |s: &str| s.trim().parse::<i32>().unwrap_or(-1);
        if let Some(rest) = line.strip_prefix("S ") {
            Some(Status::Done(code(rest)))
        } else {
            line.strip_prefix("R ")
                .map(|rest| Status::Restarted(code(rest)))
        }
    }

    /// Kills every process of the episode but its init and outer shell, until none is left.
    fn stop_command(&self) {
        // Frozen first, then killed: a shell still running when its child dies reports the kill
        // ("ooze-shell: line 3: 5 Killed …") into the command's output, and the capture reads it
        // or not depending on who the scheduler ran first; a stopped shell reports nothing.
        for pid in self.command_processes() {
            unsafe {
                libc::kill(pid, libc::SIGSTOP);
            }
        }
        for _ in 0..500 {
            let victims = self.command_processes();
            if victims.is_empty() {
                return;
            }
            for pid in victims {
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The episode's processes other than its init and outer shell (host pids).
    fn command_processes(&self) -> Vec<i32> {
        let outer = self.child.as_ref().map(|c| c.id() as i32);
        match (&self.launch.layout, self.init_pid) {
            (Layout::Container { .. }, Some(init)) => {
                let candidates = match &self.cgroup {
                    Some(g) => g.procs(),
                    None => in_pid_namespace_of(init),
                };
                candidates
                    .into_iter()
                    .filter(|&pid| Some(pid) != outer && ns_pid(pid).is_some_and(|n| n >= 3))
                    .collect()
            }
            _ => {
                let mut all = match &self.cgroup {
                    Some(g) => g.procs(),
                    None => descendants_of(outer.unwrap_or(-1)),
                };
                all.retain(|&pid| Some(pid) != outer);
                all
            }
        }
    }

    /// The root of the episode's filesystem, as the host reaches it.
    fn root(&self) -> Result<PathBuf, EnvError> {
        match (&self.launch.layout, self.init_pid) {
            (Layout::Container { .. }, Some(pid)) => Ok(PathBuf::from(format!("/proc/{pid}/root"))),
            (Layout::Container { .. }, None) => {
                Err(EnvError::Episode("the episode has no running init".into()))
            }
            (Layout::Process, _) => Ok(self.launch.scratch.clone()),
        }
    }

    /// Writes a file into the episode (relative paths from `/work`), making its directories.
    pub fn put(&self, path: &str, bytes: &[u8], mode: u32) -> Result<(), EnvError> {
        let (root, path) = self.file_root(path)?;
        files::put(&root, &path, bytes, mode)
    }

    /// Reads a file of the episode (at most `max_bytes`; [`files::DEFAULT_GET_BYTES`] is 64 MiB).
    pub fn get(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, EnvError> {
        let (root, path) = self.file_root(path)?;
        files::get(&root, &path, max_bytes)
    }

    /// In process mode the episode's `/work` is its scratch directory; other paths are refused.
    fn file_root(&self, path: &str) -> Result<(PathBuf, String), EnvError> {
        let root = self.root()?;
        if let Layout::Process = self.launch.layout {
            let rel = files::episode_path(path)?;
            let Ok(below) = rel.strip_prefix("work") else {
                return Err(EnvError::File {
                    path: path.to_owned(),
                    message: "process isolation reaches files under /work only".into(),
                });
            };
            return Ok((root, below.to_string_lossy().into_owned()));
        }
        Ok((root, path.to_owned()))
    }

    fn oom_kills(&self) -> u64 {
        self.cgroup
            .as_ref()
            .and_then(|g| g.oom_kills())
            .unwrap_or(0)
    }

    fn forks_refused(&self) -> u64 {
        self.cgroup
            .as_ref()
            .and_then(|g| g.pids_refused())
            .unwrap_or(0)
    }

    fn disk_full(&self) -> bool {
        let Ok(root) = self.root() else { return false };
        if let Layout::Process = self.launch.layout {
            return false;
        }
        let Ok(path) = std::ffi::CString::new(root.to_string_lossy().into_owned()) else {
            return false;
        };
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        unsafe { libc::statvfs(path.as_ptr(), &mut st) == 0 && st.f_bavail == 0 }
    }

    /// Output the episode wrote that nobody read (bubblewrap's own errors at start).
    async fn drain_output(&mut self, limit: usize) -> String {
        let mut buf = vec![0u8; limit];
        let n = tokio::time::timeout(Duration::from_millis(500), self.output.read(&mut buf))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// What the episode has cost so far.
    pub fn report(&self) -> EpisodeReport {
        let mut report = self.report.clone();
        report.memory_peak_bytes = self.cgroup.as_ref().and_then(|g| g.memory_peak());
        report.lifetime = self.born.elapsed();
        report
    }

    /// Ends the episode: every process killed, the writable layer gone. Returns its report.
    pub async fn close(mut self) -> EpisodeReport {
        let report = self.report();
        self.shutdown();
        report
    }

    fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // bubblewrap's --die-with-parent takes the sandbox down with it; the cgroup sweep catches
        // anything that was between the two.
        let _ = child.kill();
        if let Some(g) = &self.cgroup {
            g.kill_all();
        }
        if let Layout::Process = self.launch.layout {
            if self.cgroup.is_none() {
                for pid in descendants_of(child.id() as i32) {
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
        }
        let _ = child.wait();
        self.cgroup = None;
        let _ = std::fs::remove_dir_all(&self.launch.scratch);
    }
}

impl Drop for Episode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn read_all(mut r: pipe::Receiver) -> String {
    use tokio::io::AsyncReadExt;
    let mut s = String::new();
    let _ = r.read_to_string(&mut s).await;
    s
}

/// `"child-pid": N` of bubblewrap's info JSON.
fn child_pid(info: &str) -> Option<i32> {
    let v: serde_json::Value = serde_json::from_str(info).ok()?;
    v.get("child-pid")?.as_i64().map(|p| p as i32)
}

/// The process's id in its innermost PID namespace.
fn ns_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Host pids in the PID namespace of `init`.
fn in_pid_namespace_of(init: i32) -> Vec<i32> {
    let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let Some(target) = ns(init) else {
        return Vec::new();
    };
    all_pids()
        .into_iter()
        .filter(|&p| ns(p).as_ref() == Some(&target))
        .collect()
}

/// Every descendant of `root` (by parent links).
fn descendants_of(root: i32) -> Vec<i32> {
    let parent = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = &stat[stat.rfind(')')? + 2..];
        after.split_whitespace().nth(1)?.parse().ok()
    };
    let pids: Vec<(i32, i32)> = all_pids()
        .into_iter()
        .filter_map(|p| Some((p, parent(p)?)))
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(child, par) in &pids {
            if par == p {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_both_ends_and_counts_the_cut() {
        let mut c = Capture::new(8);
        c.push(b"abcdefghij");
        c.push(b"klmnop");
        assert_eq!(c.total, 16);
        let text = c.text();
        assert!(text.starts_with("abcd"), "{text}");
        assert!(text.ends_with("mnop"), "{text}");
        assert!(text.contains("8 bytes of output cut"), "{text}");
        let mut short = Capture::new(8);
        short.push(b"abc");
        short.push(b"de");
        assert_eq!(short.text(), "abcde");
    }
}
