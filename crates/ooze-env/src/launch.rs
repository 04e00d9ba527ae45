//! Starting an episode's first process: the steps between fork and exec, and bubblewrap's
//! arguments.
//!
//! The child joins the episode's cgroups, makes a mount namespace of its own (inside a user
//! namespace when ooze is not root), mounts a tmpfs of the episode's disk quota on an empty
//! directory, and an overlay on it: the image read-only below, the tmpfs's `upper` above. Then it
//! execs `bwrap`, which binds that overlay as `/` of a sandbox with new PID, IPC, UTS, network and
//! cgroup namespaces, a fresh `/proc` and a minimal `/dev`. Because the tmpfs and overlay belong to
//! the child's mount namespace, they vanish with the episode's last process, whatever happens to
//! ooze: nothing is left mounted on the host, and the writes never touch its disk.
//!
//! Everything the child does after the fork uses data prepared before it (no allocation).
//!
//! Processes are forked from one launcher thread that lives as long as ooze: bubblewrap's
//! `--die-with-parent` watches the *thread* that forked it, so a short-lived thread (a blocking
//! pool's) would take its episodes with it when it retires.

use crate::cgroup::EpisodeCgroup;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;

/// The capabilities of root in a container (Docker's default set, less raw sockets, `mknod` and
/// audit): enough to own files, change users and kill within the episode; nothing that reaches
/// the host (no mounts, modules, raw I/O, ptrace or namespace changes).
const CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_SETFCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
];

/// Parts of `/proc` that reach the whole machine: read-only (Docker's list). Episodes run as real
/// root with few capabilities, and the kernel lets real root write `/proc/sys` (every sysctl,
/// global ones too) and `/proc/sysrq-trigger` on file modes alone.
const PROC_READ_ONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Parts of `/proc` hidden (Docker's list): kernel memory, keys, timers, hardware.
const PROC_MASKED_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/sched_debug",
];
const PROC_MASKED_DIRS: &[&str] = &["/proc/acpi", "/proc/asound", "/proc/scsi"];

/// Host directories a `Rootfs::Host` episode sees read-only (those that exist; symlinks such as a
/// merged-usr `/bin -> usr/bin` are recreated as symlinks).
const HOST_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
];

/// Host files under `/etc` a `Rootfs::Host` episode sees: what programs need to start (the
/// dynamic linker's cache, alternatives, user names, time zone), no secrets.
const HOST_ETC: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/ssl",
    "/etc/mime.types",
];

/// The two scripts of the persistent shell, see [`crate::episode`].
pub(crate) const OUTER_SHELL: &str = r#"exec 2>/dev/null
mkdir -p /run/ooze
while :; do
  /bin/bash --noprofile --norc -c "$1" ooze-shell 2>&1
  printf 'R %d\n' "$?" >&3
  IFS= read -r -d '' __ooze_go || exit 0
done"#;

pub(crate) const INNER_SHELL: &str = r#"[ -f /run/ooze/state ] && . /run/ooze/state
while IFS= read -r -d '' __ooze_command; do
  eval "$__ooze_command" </dev/null 3>&-
  __ooze_status=$?
  { export -p; printf 'cd -- %q\n' "$PWD"; } >/run/ooze/state 2>/dev/null
  printf 'S %d\n' "$__ooze_status" >&3
done"#;

/// How the episode's first process is isolated.
#[derive(Debug, Clone)]
pub(crate) enum Layout {
    /// bubblewrap over an overlay of `lower` (an image's rootfs, or the sandbox's empty skeleton
    /// with the host's system directories bound over it).
    Container {
        bwrap: PathBuf,
        lower: PathBuf,
        host_system: bool,
        /// Real root: no user namespace, and capabilities cut to [`CAPABILITIES`].
        root: bool,
    },
    /// The explicit opt-in to no isolation: bash on the host in a scratch directory.
    Process,
}

/// Everything one launch needs.
pub(crate) struct Launch {
    pub layout: Layout,
    /// The episode's scratch directory on the host: the tmpfs's mount point (container) or its
    /// working directory (process).
    pub scratch: PathBuf,
    pub disk_bytes: u64,
    /// rlimits set in the child: (resource, value).
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub env: Vec<(String, String)>,
}

/// The pipes ooze keeps: commands in, output out, statuses out, bubblewrap's info out.
pub(crate) struct Pipes {
    pub stdin: OwnedFd,
    pub output: OwnedFd,
    pub status: OwnedFd,
    pub info: Option<OwnedFd>,
}

pub(crate) struct Started {
    pub child: Child,
    pub pipes: Pipes,
}

type Request = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` on the launcher thread.
fn spawn_on_launcher(cmd: Command) -> std::io::Result<Child> {
    static LAUNCHER: std::sync::OnceLock<std::sync::Mutex<mpsc::Sender<Request>>> =
        std::sync::OnceLock::new();
    let tx = LAUNCHER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Request>();
            std::thread::Builder::new()
                .name("ooze-env-launcher".into())
                .spawn(move || {
                    for (mut cmd, reply) in rx {
                        let _ = reply.send(cmd.spawn());
                    }
                })
                .expect("invariant: a thread can be started at first use");
            std::sync::Mutex::new(tx)
        })
        .lock()
        .expect("not poisoned")
        .clone();
    let (reply_tx, reply_rx) = mpsc::channel();
    tx.send((cmd, reply_tx))
        .map_err(|_| std::io::Error::other("the launcher thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("the launcher thread is gone"))?
}

/// A pipe, both ends closed on exec.
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned these two descriptors, owned by no one else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn c(s: &str) -> CString {
    CString::new(s).expect("invariant: paths and options have no NUL")
}

impl Launch {
    /// Starts the episode's shell; returns the child (bubblewrap, or bash in process mode) and
    /// ooze's ends of its pipes.
    pub fn start(&self, cgroup: Option<&EpisodeCgroup>) -> std::io::Result<Started> {
        let (stdin_r, stdin_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        let (info_r, info_w) = pipe()?;
        let run_dir = self.run_dir();
        let shell = [
            "--noprofile".to_string(),
            "--norc".into(),
            "-c".into(),
            OUTER_SHELL.replace("/run/ooze", &run_dir),
            "ooze-init".into(),
            INNER_SHELL.replace("/run/ooze", &run_dir),
        ];
        let mut cmd = match &self.layout {
            Layout::Container {
                bwrap,
                host_system,
                root,
                ..
            } => {
                let mut cmd = Command::new(bwrap);
                cmd.args(self.bwrap_args(*host_system, *root))
                    .arg("/bin/bash")
                    .args(&shell);
                cmd
            }
            Layout::Process => {
                let mut cmd = Command::new("/bin/bash");
                cmd.current_dir(&self.scratch).args(&shell);
                cmd
            }
        };
        cmd.env_clear().envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Layout::Process = self.layout {
            cmd.env("HOME", &self.scratch);
        }
        cmd.stdin(std::process::Stdio::from(stdin_r))
            .stdout(std::process::Stdio::from(out_w.try_clone()?))
            .stderr(std::process::Stdio::from(out_w));
        let setup = ChildSetup::new(self, cgroup, status_w.as_raw_fd(), info_w.as_raw_fd())?;
        // SAFETY: `apply` makes system calls on data prepared before the fork.
        unsafe {
            cmd.pre_exec(move || setup.apply());
        }
        let child = spawn_on_launcher(cmd)?;
        drop((status_w, info_w));
        let info = matches!(self.layout, Layout::Container { .. }).then_some(info_r);
        Ok(Started {
            child,
            pipes: Pipes {
                stdin: stdin_w,
                output: out_r,
                status: status_r,
                info,
            },
        })
    }

    /// Where the shell keeps its state: `/run/ooze` in a container; in process mode, a hidden
    /// directory of the scratch directory.
    pub fn run_dir(&self) -> String {
        match self.layout {
            Layout::Container { .. } => "/run/ooze".into(),
            Layout::Process => self.scratch.join(".ooze").to_string_lossy().into_owned(),
        }
    }

    fn merged(&self) -> PathBuf {
        self.scratch.join("root")
    }

    fn bwrap_args(&self, host_system: bool, root: bool) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
        push(&["--bind", &self.merged().to_string_lossy(), "/"]);
        push(&["--proc", "/proc", "--dev", "/dev"]);
        for path in PROC_READ_ONLY {
            push(&["--ro-bind-try", path, path]);
        }
        for path in PROC_MASKED_FILES {
            if Path::new(path).exists() {
                push(&["--ro-bind", "/dev/null", path]);
            }
        }
        for path in PROC_MASKED_DIRS {
            if Path::new(path).is_dir() {
                push(&["--tmpfs", path, "--remount-ro", path]);
            }
        }
        if host_system {
            for dir in HOST_DIRS {
                let path = Path::new(dir);
                match std::fs::read_link(path) {
                    Ok(target) => push(&["--symlink", &target.to_string_lossy(), dir]),
                    Err(_) if path.is_dir() => push(&["--ro-bind", dir, dir]),
                    Err(_) => {}
                }
            }
            for file in HOST_ETC {
                push(&["--ro-bind-try", file, file]);
            }
        }
        push(&["--dir", "/work", "--dir", "/tmp", "--dir", "/run/ooze"]);
        push(&[
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "episode",
            "--chdir",
            "/work",
            "--info-fd",
            "4",
        ]);
        if root {
            push(&["--cap-drop", "ALL"]);
            for cap in CAPABILITIES {
                push(&["--cap-add", cap]);
            }
        }
        push(&["--"]);
        a
    }
}

/// What the child does between fork and exec, prepared beforehand.
struct ChildSetup {
    join: Vec<CString>,
    /// Set for containers: the mount namespace and overlay.
    mounts: Option<Mounts>,
    rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    status_fd: i32,
    info_fd: i32,
}

struct Mounts {
    user_namespace: bool,
    uid_map: CString,
    gid_map: CString,
    scratch: CString,
    tmpfs_options: CString,
    dirs: [CString; 3],
    merged: CString,
    overlay_options: CString,
}

impl ChildSetup {
    fn new(
        launch: &Launch,
        cgroup: Option<&EpisodeCgroup>,
        status_fd: i32,
        info_fd: i32,
    ) -> std::io::Result<ChildSetup> {
        let mounts = match &launch.layout {
            Layout::Container { lower, root, .. } => {
                let s = &launch.scratch;
                let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
                let upper = s.join("upper");
                let work = s.join("work");
                let mut overlay = format!(
                    "lowerdir={},upperdir={},workdir={}",
                    lower.display(),
                    upper.display(),
                    work.display()
                );
                if !root {
                    overlay.push_str(",userxattr");
                }
                Some(Mounts {
                    user_namespace: !root,
                    uid_map: c(&format!("0 {uid} 1")),
                    gid_map: c(&format!("0 {gid} 1")),
                    scratch: c(&s.to_string_lossy()),
                    tmpfs_options: c(&format!("size={},mode=0755", launch.disk_bytes)),
                    dirs: [
                        c(&upper.to_string_lossy()),
                        c(&work.to_string_lossy()),
                        c(&launch.merged().to_string_lossy()),
                    ],
                    merged: c(&launch.merged().to_string_lossy()),
                    overlay_options: c(&overlay),
                })
            }
            Layout::Process => None,
        };
        Ok(ChildSetup {
            join: cgroup.map(|g| g.join_files().to_vec()).unwrap_or_default(),
            mounts,
            rlimits: launch.rlimits.clone(),
            status_fd,
            info_fd,
        })
    }

    /// Runs in the child.
    fn apply(&self) -> std::io::Result<()> {
        let check = |r: libc::c_int| {
            if r == -1 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        unsafe {
            // The status pipe is fd 3 and bubblewrap's info pipe fd 4 in the child; dup2 clears
            // close-on-exec, and a descriptor already at its place has the flag cleared by hand.
            for (fd, at) in [(self.status_fd, 3), (self.info_fd, 4)] {
                if fd == at {
                    check(libc::fcntl(fd, libc::F_SETFD, 0))?;
                } else {
                    check(libc::dup2(fd, at))?;
                }
            }
            for file in &self.join {
                write_file(file, c"0")?;
            }
            if self.mounts.is_none() {
                check(libc::setsid())?;
            }
            if let Some(m) = &self.mounts {
                if m.user_namespace {
                    check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS))?;
                    write_file(c"/proc/self/setgroups", c"deny")?;
                    write_file(c"/proc/self/uid_map", &m.uid_map)?;
                    write_file(c"/proc/self/gid_map", &m.gid_map)?;
                } else {
                    check(libc::unshare(libc::CLONE_NEWNS))?;
                }
                let null = std::ptr::null();
                check(libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    m.scratch.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    m.tmpfs_options.as_ptr().cast(),
                ))?;
                for dir in &m.dirs {
                    check(libc::mkdir(dir.as_ptr(), 0o755))?;
                }
                check(libc::mount(
                    c"overlay".as_ptr(),
                    m.merged.as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    m.overlay_options.as_ptr().cast(),
                ))?;
            }
            for &(resource, value) in &self.rlimits {
                let limit = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                check(libc::setrlimit(resource, &limit))?;
            }
        }
        Ok(())
    }
}

/// Writes `value` to a file without allocating (a /proc or cgroup file), for use between fork and
/// exec.
///
/// # Safety
/// Only system calls on the given strings; safe to call in a forked child.
pub unsafe fn write_file(path: &CStr, value: &CStr) -> std::io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let bytes = value.to_bytes();
    let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
    libc::close(fd);
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
