//! Per-episode control groups: memory, process count and CPU limits, peak memory, and a list of
//! every process an episode started (so none outlives it).
//!
//! Version 1 (one hierarchy per controller, as on the 2-core CI machines) and version 2 (one
//! unified hierarchy) are both used where this process may create groups under its own. Each
//! process of ooze makes `ooze-<pid>` under its group in every writable controller, and one
//! `ep-<n>` per episode below it. In v2 a group that holds processes cannot hand controllers
//! down to its children, so a job its launcher put in a group of its own (the GPU machines'
//! `/process_api/<id>`) often gets none there; run as root, ooze then makes `ooze-<pid>` under
//! the root group instead, enabling the controllers there (`use_root_group`). The episode's
//! first process joins the groups before it execs (writing `0` to `cgroup.procs` moves the
//! writer), so everything it starts is counted.
//! Groups left by an ooze process that died are emptied and removed by the next one.
//!
//! The groups are probed once per process ([`Cgroups::shared`]) and `ooze-<pid>` stays until the
//! process ends: sandboxes come and go, and their episodes' groups are numbered process-wide.
//!
//! Where no controller is writable (no root, no delegation), [`Cgroups::probe`] says so and the
//! sandbox falls back to rlimits, which it reports.

use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The controllers ooze limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
        }
    }
}

const ALL: [Controller; 3] = [Controller::Memory, Controller::Pids, Controller::Cpu];

/// Where the kernel's cgroup filesystem is mounted.
const CGROUP_FS: &str = "/sys/fs/cgroup";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The writable controllers of this process, each with the `ooze-<pid>` directory its episodes'
/// groups go under.
#[derive(Debug)]
pub struct Cgroups {
    pub version: Option<CgroupVersion>,
    /// (controller, `…/ooze-<pid>`); in v2 all share one directory.
    parents: Vec<(Controller, PathBuf)>,
    next: std::sync::atomic::AtomicU64,
}

/// Limits of one episode's group.
#[derive(Debug, Clone, Copy)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    pub processes: u64,
    /// CPU time per wall-clock second (1.0 = one core).
    pub cpus: f64,
}

impl Cgroups {
    /// This process's groups, probed at first use.
    pub fn shared() -> &'static Cgroups {
        static SHARED: std::sync::OnceLock<Cgroups> = std::sync::OnceLock::new();
        SHARED.get_or_init(Cgroups::probe)
    }

    /// Finds this process's groups and makes `ooze-<pid>` where it can.
    fn probe() -> Cgroups {
        let mut cgroups = Cgroups {
            version: None,
            parents: Vec::new(),
            next: 0.into(),
        };
        let Ok(own) = std::fs::read_to_string("/proc/self/cgroup") else {
            return cgroups;
        };
        let mine = format!("ooze-{}", std::process::id());
        let v1 = Path::new(CGROUP_FS).join("memory").is_dir()
            || Path::new(CGROUP_FS).join("pids").is_dir();
        if v1 {
            for line in own.lines() {
                // "4:memory:/path"
                let mut parts = line.splitn(3, ':');
                let (_, names, path) = (parts.next(), parts.next(), parts.next());
                let (Some(names), Some(path)) = (names, path) else {
                    continue;
                };
                for c in ALL {
                    if names.split(',').any(|n| n == c.name()) {
                        let base = Path::new(CGROUP_FS)
                            .join(c.name())
                            .join(path.trim_start_matches('/'));
                        if let Some(dir) = make_parent(&base, &mine) {
                            cgroups.parents.push((c, dir));
                        }
                    }
                }
            }
            if !cgroups.parents.is_empty() {
                cgroups.version = Some(CgroupVersion::V1);
            }
        } else if let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) {
            let own_group = Path::new(CGROUP_FS).join(path.trim_start_matches('/'));
            let mut parents = v2_parents(&own_group, &mine);
            let is_root = unsafe { libc::geteuid() } == 0;
            let given: Vec<Controller> = parents.iter().map(|(c, _)| *c).collect();
            if use_root_group(&given, is_root, own_group == Path::new(CGROUP_FS)) {
                let root = Path::new(CGROUP_FS);
                for c in ALL {
                    // One at a time: a controller the root lacks must not block the others.
                    let _ = std::fs::write(
                        root.join("cgroup.subtree_control"),
                        format!("+{}", c.name()),
                    );
                }
                let at_root = v2_parents(root, &mine);
                let (kept, dropped) = if at_root.len() > parents.len() {
                    (at_root, own_group.join(&mine))
                } else {
                    (parents, root.join(&mine))
                };
                let _ = std::fs::remove_dir(dropped);
                parents = kept;
            }
            cgroups.parents = parents;
            if !cgroups.parents.is_empty() {
                cgroups.version = Some(CgroupVersion::V2);
            }
        }
        cgroups
    }

    /// The controllers in force, by name.
    pub fn controllers(&self) -> Vec<&'static str> {
        self.parents.iter().map(|(c, _)| c.name()).collect()
    }

    /// The `ooze-<pid>` directory of the first controller (v2: of all), if any.
    pub fn group(&self) -> Option<&Path> {
        self.parents.first().map(|(_, d)| d.as_path())
    }

    pub fn has(&self, controller: Controller) -> bool {
        self.parents.iter().any(|(c, _)| *c == controller)
    }

    /// A new group for one episode, with `limits` set.
    pub fn episode(&self, limits: &CgroupLimits) -> std::io::Result<EpisodeCgroup> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut group = EpisodeCgroup {
            version: self.version,
            dirs: Vec::new(),
            join: Vec::new(),
        };
        for (controller, parent) in &self.parents {
            let dir = parent.join(format!("ep-{n}"));
            if !group.dirs.iter().any(|(_, d)| *d == dir) {
                std::fs::create_dir(&dir)?;
                group.join.push(
                    CString::new(dir.join("cgroup.procs").to_string_lossy().into_owned())
                        .expect("invariant: no NUL in a cgroup path"),
                );
            }
            group.dirs.push((*controller, dir.clone()));
            group.set(*controller, &dir, limits)?;
        }
        Ok(group)
    }
}

/// `base/name` made as a v2 parent, with every controller of ours that `base` hands down
/// enabled for its children; none when they cannot be enabled.
fn v2_parents(base: &Path, name: &str) -> Vec<(Controller, PathBuf)> {
    let Some(dir) = make_parent(base, name) else {
        return Vec::new();
    };
    let available = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let given: Vec<Controller> = ALL
        .into_iter()
        .filter(|c| available.split_whitespace().any(|n| n == c.name()))
        .collect();
    let enable: Vec<String> = given.iter().map(|c| format!("+{}", c.name())).collect();
    if std::fs::write(dir.join("cgroup.subtree_control"), enable.join(" ")).is_err() {
        return Vec::new();
    }
    given.into_iter().map(|c| (c, dir.clone())).collect()
}

/// Whether v2 groups go under the root group rather than this process's own: only for root
/// (who may write there), and only when the own group hands down fewer than all three
/// controllers (a group that holds processes cannot enable controllers for its children, so
/// a job put in a group of its own by its launcher often gets none).
fn use_root_group(own_gives: &[Controller], is_root: bool, own_is_root_group: bool) -> bool {
    is_root && !own_is_root_group && ALL.iter().any(|c| !own_gives.contains(c))
}

/// `base/name`, made if need be, after removing groups of ooze processes no longer running.
fn make_parent(base: &Path, name: &str) -> Option<PathBuf> {
    if let Ok(entries) = std::fs::read_dir(base) {
        for e in entries.flatten() {
            let file = e.file_name();
            let Some(pid) = file
                .to_str()
                .and_then(|n| n.strip_prefix("ooze-"))
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            if unsafe { libc::kill(pid, 0) } != 0 {
                remove_tree(&e.path());
            }
        }
    }
    let dir = base.join(name);
    match std::fs::create_dir(&dir) {
        Ok(()) => Some(dir),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Some(dir),
        Err(_) => None,
    }
}

/// Kills every process of a stale `ooze-<pid>` tree and removes its groups.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                kill_procs(&e.path());
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn procs_of(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// SIGKILLs the group's processes until none is left (a fork bomb refills it while it is
/// emptied, within its pids limit), for at most about a second.
fn kill_procs(dir: &Path) {
    for _ in 0..500 {
        let procs = procs_of(dir);
        if procs.is_empty() {
            return;
        }
        for pid in procs {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// One episode's groups; killed and removed on drop.
#[derive(Debug)]
pub struct EpisodeCgroup {
    version: Option<CgroupVersion>,
    dirs: Vec<(Controller, PathBuf)>,
    /// The `cgroup.procs` files the episode's first process writes `0` to.
    join: Vec<CString>,
}

impl EpisodeCgroup {
    fn set(&self, controller: Controller, dir: &Path, l: &CgroupLimits) -> std::io::Result<()> {
        let write = |file: &str, value: String| {
            std::fs::write(dir.join(file), &value).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("writing {value} to {}: {e}", dir.join(file).display()),
                )
            })
        };
        let quota = ((l.cpus * 100_000.0) as u64).max(1000);
        match (self.version, controller) {
            (Some(CgroupVersion::V1), Controller::Memory) => {
                write("memory.limit_in_bytes", l.memory_bytes.to_string())?;
                // No swapping past the limit either, where the kernel accounts swap.
                if dir.join("memory.memsw.limit_in_bytes").exists() {
                    write("memory.memsw.limit_in_bytes", l.memory_bytes.to_string())?;
                }
                Ok(())
            }
            (Some(CgroupVersion::V1), Controller::Pids) => {
                write("pids.max", l.processes.to_string())
            }
            (Some(CgroupVersion::V1), Controller::Cpu) => {
                write("cpu.cfs_period_us", "100000".into())?;
                write("cpu.cfs_quota_us", quota.to_string())
            }
            (Some(CgroupVersion::V2), Controller::Memory) => {
                write("memory.max", l.memory_bytes.to_string())?;
                let _ = write("memory.swap.max", "0".into());
                Ok(())
            }
            (Some(CgroupVersion::V2), Controller::Pids) => {
                write("pids.max", l.processes.to_string())
            }
            (Some(CgroupVersion::V2), Controller::Cpu) => {
                write("cpu.max", format!("{quota} 100000"))
            }
            (None, _) => Ok(()),
        }
    }

    /// The files the first process writes `0` to, in `pre_exec`.
    pub(crate) fn join_files(&self) -> &[CString] {
        &self.join
    }

    fn dir(&self, controller: Controller) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| *c == controller)
            .map(|(_, d)| d.as_path())
    }

    /// The most memory the episode used at once, bytes (page cache and its tmpfs included).
    pub fn memory_peak(&self) -> Option<u64> {
        let dir = self.dir(Controller::Memory)?;
        let file = match self.version? {
            CgroupVersion::V1 => "memory.max_usage_in_bytes",
            CgroupVersion::V2 => "memory.peak",
        };
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Processes the kernel's OOM killer ended in this group so far.
    pub fn oom_kills(&self) -> Option<u64> {
        let dir = self.dir(Controller::Memory)?;
        let (file, key) = match self.version? {
            CgroupVersion::V1 => ("memory.oom_control", "oom_kill"),
            CgroupVersion::V2 => ("memory.events", "oom_kill"),
        };
        counter(&dir.join(file), key)
    }

    /// Forks refused at the process limit so far.
    pub fn pids_refused(&self) -> Option<u64> {
        counter(&self.dir(Controller::Pids)?.join("pids.events"), "max")
    }

    /// Every process in the episode's groups.
    pub fn procs(&self) -> Vec<i32> {
        let mut all: Vec<i32> = self.dirs.iter().flat_map(|(_, d)| procs_of(d)).collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Kills every process of the episode.
    pub fn kill_all(&self) {
        for (_, dir) in &self.dirs {
            kill_procs(dir);
        }
    }
}

fn counter(file: &Path, key: &str) -> Option<u64> {
    std::fs::read_to_string(file)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

impl Drop for EpisodeCgroup {
    fn drop(&mut self) {
        self.kill_all();
        for (_, dir) in &self.dirs {
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                kill_procs(dir);
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_group_only_for_root_when_the_own_group_falls_short() {
        use Controller::*;
        // The GPU machine: root, own group `/process_api/<id>` hands nothing down.
        assert!(use_root_group(&[], true, false));
        assert!(use_root_group(&[Memory], true, false));
        // Everything handed down, not root, or already at the root: stay.
        assert!(!use_root_group(&[Memory, Pids, Cpu], true, false));
        assert!(!use_root_group(&[Cpu, Pids, Memory], true, false));
        assert!(!use_root_group(&[], false, false));
        assert!(!use_root_group(&[Memory], true, true));
    }
}
