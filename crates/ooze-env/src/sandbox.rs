//! The sandbox: one way to run anything an agent asks for, from a Python snippet to a 16-turn
//! terminal session, each in an episode of its own.
//!
//! [`Sandbox::new`] probes the machine once (bubblewrap, namespaces, which cgroup controllers are
//! writable) by starting a trial episode, and fails with what is missing unless the caller opted
//! into [`IsolationMode::Process`]. [`Sandbox::start`] then starts episodes on a [`Rootfs`]: a
//! Debian image (see [`crate::image`]) or the host's own system directories, read-only either way,
//! with a writable layer per episode. [`Isolation`] says what is in force, for logs and metrics.
//!
//! At most [`EpisodeLimits::concurrent`] commands of one sandbox run at once (episodes may be many
//! more: an idle shell costs a few megabytes and no CPU); the others wait, and their timeout
//! counts from their start, so hundreds of trajectories calling tools at once do not starve each
//! other into timeouts.

use crate::cgroup::{CgroupLimits, CgroupVersion, Cgroups, Controller};
use crate::episode::Episode;
use crate::error::EnvError;
use crate::image::{find_program, Image};
use crate::launch::{Launch, Layout};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// How episodes are isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationMode {
    /// bubblewrap with namespaces and an overlay root (the default, required unless opted out).
    #[default]
    Container,
    /// An explicit opt-in for machines without bubblewrap or namespaces: bash on the host, in a
    /// scratch directory, under cgroups where writable and rlimits otherwise. Host files are
    /// visible and a daemon can outlive its episode; [`Isolation`] says so.
    Process,
}

impl IsolationMode {
    /// `$OOZE_ISOLATION` (`container` or `process`), the opt-in for agents' tools on machines
    /// without bubblewrap or namespaces; `container` when unset.
    pub fn from_env() -> Result<IsolationMode, EnvError> {
        match std::env::var("OOZE_ISOLATION") {
            Err(_) => Ok(IsolationMode::Container),
            Ok(v) => v
                .parse()
                .map_err(|e: String| EnvError::Episode(format!("OOZE_ISOLATION: {e}"))),
        }
    }
}

impl std::str::FromStr for IsolationMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "container" => Ok(IsolationMode::Container),
            "process" => Ok(IsolationMode::Process),
            other => Err(format!(
                "unknown isolation {other:?}: expected \"container\" or \"process\""
            )),
        }
    }
}

/// How long the trial episode's `echo ready` may take (a loaded machine may take seconds).
const TRIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Limits of each episode and of its commands.
#[derive(Debug, Clone)]
pub struct EpisodeLimits {
    /// Memory of all the episode's processes together (its tmpfs pages included), bytes.
    pub memory_bytes: u64,
    /// Processes and threads of the episode at once.
    pub processes: u64,
    /// CPU time per second of wall clock (1.0 = one core).
    pub cpus: f64,
    /// Size of the writable layer (everything the episode writes), bytes.
    pub disk_bytes: u64,
    /// Open files per process.
    pub open_files: u64,
    /// Output kept per command (the first and last halves), bytes.
    pub output_bytes: usize,
    /// Output past which a command is stopped, bytes.
    pub flood_bytes: u64,
    /// Wall clock per command unless the caller gives one.
    pub command_timeout: Duration,
    /// Commands of one sandbox running at once.
    pub concurrent: usize,
}

impl EpisodeLimits {
    /// Twice the CPUs this process may use, at least 4.
    pub fn default_concurrent() -> usize {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (2 * cpus).max(4)
    }
}

impl Default for EpisodeLimits {
    fn default() -> Self {
        EpisodeLimits {
            memory_bytes: 1 << 30,
            processes: 256,
            cpus: 1.0,
            disk_bytes: 512 << 20,
            open_files: 1024,
            output_bytes: 16 << 10,
            flood_bytes: 64 << 20,
            command_timeout: Duration::from_secs(30),
            concurrent: EpisodeLimits::default_concurrent(),
        }
    }
}

/// The root filesystem of an episode.
#[derive(Debug, Clone)]
pub enum Rootfs {
    /// A Debian image built by `ooze env build`.
    Image(Image),
    /// The host's `/usr`, `/bin`, `/lib*` and `/opt` and a few `/etc` files (no secrets),
    /// read-only: the host's own interpreters, for tools that need nothing else.
    Host,
}

/// What isolation is in force, probed once per sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Isolation {
    pub mode: IsolationMode,
    /// `bwrap --version`.
    pub bubblewrap: Option<String>,
    /// ooze is not root: its episodes live in a user namespace of its own.
    pub user_namespace: bool,
    pub cgroup: Option<CgroupVersion>,
    /// The `ooze-<pid>` group the episodes' groups go under (v1: the first controller's).
    pub cgroup_group: Option<PathBuf>,
    /// Cgroup controllers limiting each episode.
    pub controllers: Vec<&'static str>,
    /// Limits kept by rlimits instead (no writable controller).
    pub rlimits: Vec<&'static str>,
    /// Limits nothing enforces here.
    pub unlimited: Vec<&'static str>,
}

impl Isolation {
    /// True when episodes run in containers with memory and process limits in force.
    pub fn contained(&self) -> bool {
        self.mode == IsolationMode::Container && !self.unlimited.contains(&"processes")
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.mode {
            IsolationMode::Container => write!(
                f,
                "container ({}; namespaces: {}mount, pid, ipc, uts, net, cgroup; root: image \
                 read-only under a per-episode overlay on a tmpfs of the disk quota)",
                self.bubblewrap.as_deref().unwrap_or("bubblewrap"),
                if self.user_namespace { "user, " } else { "" },
            )?,
            IsolationMode::Process => write!(
                f,
                "process (no namespaces: host files visible, network open, daemons may outlive \
                 episodes)"
            )?,
        }
        match self.cgroup {
            Some(v) => write!(
                f,
                "; cgroup {} ({}): {}",
                if v == CgroupVersion::V1 { "v1" } else { "v2" },
                self.cgroup_group
                    .as_deref()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default(),
                self.controllers.join(", ")
            )?,
            None => write!(f, "; no writable cgroup")?,
        }
        if !self.rlimits.is_empty() {
            write!(f, "; rlimits: {}", self.rlimits.join(", "))?;
        }
        if !self.unlimited.is_empty() {
            write!(f, "; NOT limited: {}", self.unlimited.join(", "))?;
        }
        Ok(())
    }
}

/// Starts episodes; cheap to clone and share between tasks.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub(crate) inner: Arc<SandboxInner>,
}

#[derive(Debug)]
pub(crate) struct SandboxInner {
    pub limits: EpisodeLimits,
    pub isolation: Isolation,
    pub cgroups: &'static Cgroups,
    bwrap: Option<PathBuf>,
    /// `…/ooze-episodes-<pid>`: one scratch directory per episode below it.
    scratch: tempfile::TempDir,
    /// The empty lower layer of `Rootfs::Host` episodes.
    skeleton: PathBuf,
    pub slots: Arc<Semaphore>,
    next: std::sync::atomic::AtomicU64,
}

impl Sandbox {
    /// Probes this machine and starts a trial episode (on a thread of its own, so it may be
    /// called from async code or not); errors name what is missing.
    pub fn new(mode: IsolationMode, limits: EpisodeLimits) -> Result<Sandbox, EnvError> {
        if limits.concurrent == 0 {
            return Err(EnvError::Episode(
                "`concurrent` is 0: at least one command must be allowed to run".into(),
            ));
        }
        let root = unsafe { libc::geteuid() } == 0;
        let bwrap = match mode {
            IsolationMode::Container => {
                Some(find_program("bwrap").ok_or_else(|| EnvError::Missing {
                    missing: "bubblewrap (`bwrap`) is not installed".into(),
                    fix: "install it with `apt-get install bubblewrap`".into(),
                })?)
            }
            IsolationMode::Process => None,
        };
        let bubblewrap = bwrap.as_ref().and_then(|b| {
            let out = std::process::Command::new(b)
                .arg("--version")
                .output()
                .ok()?;
            Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        });
        let cgroups = Cgroups::shared();
        let mut rlimits = vec!["open files"];
        let mut unlimited = Vec::new();
        if !cgroups.has(Controller::Memory) {
            rlimits.push("memory (address space per process)");
        }
        if !cgroups.has(Controller::Pids) {
            if root {
                // RLIMIT_NPROC does not bind root.
                unlimited.push("processes");
            } else {
                rlimits.push("processes (per user, shared by all episodes)");
            }
        }
        if !cgroups.has(Controller::Cpu) {
            unlimited.push("cpu share");
        }
        if mode == IsolationMode::Process {
            unlimited.push("disk");
        }
        let isolation = Isolation {
            mode,
            bubblewrap,
            user_namespace: mode == IsolationMode::Container && !root,
            cgroup: cgroups.version,
            cgroup_group: cgroups.group().map(Path::to_path_buf),
            controllers: cgroups.controllers(),
            rlimits,
            unlimited,
        };
        let scratch = tempfile::Builder::new()
            .prefix(&format!("ooze-episodes-{}-", std::process::id()))
            .tempdir()
            .map_err(EnvError::io("making the episodes' scratch directory"))?;
        let skeleton = scratch.path().join("skeleton");
        for dir in [
            "work", "tmp", "root", "home", "etc", "run", "var/tmp", "proc", "dev",
        ] {
            std::fs::create_dir_all(skeleton.join(dir))
                .map_err(EnvError::io("making the host root's skeleton"))?;
        }
        let sandbox = Sandbox {
            inner: Arc::new(SandboxInner {
                slots: Arc::new(Semaphore::new(limits.concurrent)),
                limits,
                isolation,
                cgroups,
                bwrap,
                scratch,
                skeleton,
                next: 0.into(),
            }),
        };
        let trial = sandbox.clone();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(EnvError::io("starting a runtime for the trial episode"))?
                        .block_on(trial.trial(mode))
                })
                .join()
                .expect("invariant: the trial does not panic")
        })?;
        Ok(sandbox)
    }

    /// An episode that must start and answer.
    async fn trial(&self, mode: IsolationMode) -> Result<(), EnvError> {
        let mut trial = self.start(&Rootfs::Host).await.map_err(|e| match mode {
            IsolationMode::Container => EnvError::Missing {
                missing: format!("a trial container did not start ({e})"),
                fix: "check that user namespaces are enabled \
                      (`sysctl kernel.unprivileged_userns_clone=1`) or run as root"
                    .into(),
            },
            IsolationMode::Process => e,
        })?;
        // The probe is not an agent's command: it gets a timeout of its own, not the episode's
        // `command_timeout` (which a recipe may set to milliseconds).
        let out = trial.run("echo ready", Some(TRIAL_TIMEOUT)).await?;
        trial.close().await;
        if out.output.trim() != "ready" {
            return Err(EnvError::Episode(format!(
                "the trial episode answered {:?} instead of \"ready\"",
                out.output
            )));
        }
        Ok(())
    }

    pub fn isolation(&self) -> &Isolation {
        &self.inner.isolation
    }

    pub fn limits(&self) -> &EpisodeLimits {
        &self.inner.limits
    }

    /// Starts an episode on `rootfs` with this sandbox's limits; it is ready for commands.
    pub async fn start(&self, rootfs: &Rootfs) -> Result<Episode, EnvError> {
        self.start_with(rootfs, &self.inner.limits).await
    }

    /// Starts an episode with limits of its own (the sandbox's concurrency still applies).
    pub async fn start_with(
        &self,
        rootfs: &Rootfs,
        limits: &EpisodeLimits,
    ) -> Result<Episode, EnvError> {
        let inner = &self.inner;
        let n = inner
            .next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scratch = inner.scratch.path().join(format!("ep-{n}"));
        std::fs::create_dir(&scratch)
            .map_err(EnvError::io(format!("making {}", scratch.display())))?;
        let root = unsafe { libc::geteuid() } == 0;
        let layout = match (&inner.bwrap, rootfs) {
            (Some(bwrap), Rootfs::Image(image)) => Layout::Container {
                bwrap: bwrap.clone(),
                lower: image.rootfs(),
                host_system: false,
                root,
            },
            (Some(bwrap), Rootfs::Host) => Layout::Container {
                bwrap: bwrap.clone(),
                lower: inner.skeleton.clone(),
                host_system: true,
                root,
            },
            (None, _) => Layout::Process,
        };
        let mut rlimits = vec![
            (libc::RLIMIT_NOFILE, limits.open_files),
            (libc::RLIMIT_CORE, 0),
        ];
        if !inner.cgroups.has(Controller::Memory) {
            rlimits.push((libc::RLIMIT_AS, limits.memory_bytes));
        }
        if !inner.cgroups.has(Controller::Pids) && !root {
            rlimits.push((libc::RLIMIT_NPROC, limits.processes));
        }
        let home = match layout {
            Layout::Container { .. } => "/root".to_string(),
            Layout::Process => scratch.to_string_lossy().into_owned(),
        };
        let launch = Launch {
            layout,
            scratch,
            disk_bytes: limits.disk_bytes,
            rlimits,
            env: vec![
                (
                    "PATH".into(),
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                ),
                ("HOME".into(), home),
                ("LANG".into(), "C.UTF-8".into()),
                ("TERM".into(), "dumb".into()),
                ("PYTHONUNBUFFERED".into(), "1".into()),
                ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
            ],
        };
        let cgroup = if inner.cgroups.version.is_some() {
            Some(
                inner
                    .cgroups
                    .episode(&CgroupLimits {
                        memory_bytes: limits.memory_bytes,
                        processes: limits.processes,
                        cpus: limits.cpus,
                    })
                    .map_err(EnvError::io("making the episode's cgroup"))?,
            )
        } else {
            None
        };
        Episode::start(self.clone(), launch, cgroup, limits.clone()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_names_parse_and_bad_ones_list_the_choices() {
        assert_eq!("container".parse(), Ok(IsolationMode::Container));
        assert_eq!("process".parse(), Ok(IsolationMode::Process));
        let err = "docker".parse::<IsolationMode>().unwrap_err();
        assert!(
            err.contains("container") && err.contains("process"),
            "{err}"
        );
    }
}
