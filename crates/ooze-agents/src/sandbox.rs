//! Running model-written Python in a sandbox process.
//!
//! Each execution gets a fresh temporary directory and runs `python3 -I main.py` in it with a clean
//! environment, under these limits:
//! - CPU seconds, address space (memory), size of any file written, open files and processes
//!   (`setrlimit`); no core dumps;
//! - wall clock: on timeout the whole process tree is killed;
//! - output: stdout and stderr are read up to a cap; a program that writes more is stopped.
//!
//! At most [`SandboxLimits::concurrent`] programs of a sandbox run at once; the others wait for a
//! slot, and their wall clock starts when they do.
//!
//! Run as root (CI, the GPU machines, containers), it is also isolated: a new network namespace
//! (loopback only, down: no network), a new mount namespace in which `/tmp` is its own directory and
//! `/dev/shm` and `/var/tmp` are private, and a user id of its own from a pool (so it cannot write
//! outside its directory, its process limit is its own, and killing every process of that uid
//! kills its whole tree, even processes that left the process group). Without root, user and
//! network namespaces are used where the kernel allows; file isolation then rests on the user's own
//! permissions, which [`Isolation`] reports.
//!
//! Every outcome — exit code, signal, timeout, output cut, limit hit — is reported in
//! [`Execution`], and [`Execution::observation`] turns it into the text an agent shows the model.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Limits of one execution.
#[derive(Debug, Clone)]
pub struct SandboxLimits {
    pub wall: Duration,
    pub cpu_seconds: u64,
    /// Address space of each process, bytes.
    pub memory_bytes: u64,
    /// stdout and stderr kept, bytes each; more stops the program.
    pub output_bytes: usize,
    /// Largest file the program may write, bytes.
    pub file_bytes: u64,
    /// Processes (threads included) of the sandbox at once.
    pub processes: u64,
    /// Programs of one `Sandbox` (and its clones) running at once; more wait for a slot before
    /// they start, so their wall clock counts from their start, not from their queueing. Many
    /// hundred trajectories calling tools at once would otherwise starve each other of CPU and
    /// time out programs that need a few milliseconds.
    pub concurrent: usize,
}

impl SandboxLimits {
    /// Twice the CPUs this process may use, at least 4: programs that wait (on I/O, on sleep)
    /// overlap, and CPU-bound ones get at least half a core.
    pub fn default_concurrent() -> usize {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (2 * cpus).max(4)
    }
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            wall: Duration::from_secs(30),
            cpu_seconds: 30,
            memory_bytes: 2 << 30,
            output_bytes: 64 << 10,
            file_bytes: 64 << 20,
            processes: 64,
            concurrent: SandboxLimits::default_concurrent(),
        }
    }
}

/// What isolation this machine allows, probed once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Root: network, mount and uid isolation.
    Full,
    /// User and network namespaces, no uid change: no network; files as the user's permissions.
    NetworkOnly,
    /// Only limits, process groups and timeouts.
    LimitsOnly,
}

/// How one execution ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub stdout: String,
    pub stderr: String,
    /// The exit code, if the program exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it, if one did (9 also after a timeout or output overflow).
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Output past `output_bytes` was cut (and the program stopped).
    pub output_truncated: bool,
    pub duration: Duration,
    /// The wall-clock limit it ran under.
    pub wall_limit: Duration,
}

impl Execution {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out && !self.output_truncated
    }

    /// The text an agent shows the model: the output, then what went wrong, if anything.
    pub fn observation(&self) -> String {
        let mut out = self.stdout.clone();
        if !self.stderr.is_empty() {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&self.stderr);
        }
        let mut notes = Vec::new();
        if self.timed_out {
            notes.push(format!(
                "TIMEOUT: still running at the {:.1} s limit, stopped",
                self.wall_limit.as_secs_f64()
            ));
        }
        if self.output_truncated {
            notes.push("TRUNCATED: the output was too long and the program was stopped".into());
        }
        match (self.exit_code, self.signal) {
            (Some(0), _) => {}
            (Some(code), _) => notes.push(format!("exit code {code}")),
            (None, Some(libc::SIGXCPU)) => notes.push("CPU time limit exceeded".into()),
            (None, Some(libc::SIGXFSZ)) => notes.push("file size limit exceeded".into()),
            (None, Some(sig)) if !self.timed_out && !self.output_truncated => {
                notes.push(format!("killed by signal {sig}"))
            }
            _ => {}
        }
        if !notes.is_empty() {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&notes.join("; "));
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox: {0}")]
    Io(#[from] std::io::Error),
    #[error("sandbox: no Python interpreter at {0} (set the sandbox's python path)")]
    NoPython(PathBuf),
    #[error("sandbox: `concurrent` is 0; at least one program must be allowed to run")]
    NoSlots,
}

/// The uids sandboxes run as under root: one process-wide pool of 1024, placed by the process id
/// in a high range no account uses, so two ooze processes rarely share one; a uid that still has
/// processes (another process's sandbox) is skipped.
fn uid_pool() -> &'static Mutex<Vec<u32>> {
    static POOL: std::sync::OnceLock<Mutex<Vec<u32>>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let base = 7_340_000 + (std::process::id() % 2000) * 1024;
        Mutex::new((0..1024).rev().map(|i| base + i).collect())
    })
}

/// A free uid from the pool.
fn take_uid() -> Option<u32> {
    let mut pool = uid_pool().lock().expect("not poisoned");
    let at = pool.iter().rposition(|&uid| processes_of(uid).is_empty())?;
    Some(pool.remove(at))
}

fn give_back_uid(uid: u32) {
    uid_pool().lock().expect("not poisoned").push(uid);
}

/// Runs programs; cheap to clone and share between tasks.
#[derive(Debug, Clone)]
pub struct Sandbox {
    python: PathBuf,
    limits: SandboxLimits,
    isolation: Isolation,
    /// `limits.concurrent` permits, shared by clones.
    slots: Arc<Semaphore>,
}

impl Sandbox {
    /// A sandbox with `limits`, running the system Python (`/usr/bin/python3`, else `python3` on
    /// the PATH), isolated as far as this machine allows.
    pub fn new(limits: SandboxLimits) -> Result<Sandbox, SandboxError> {
        let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| PathBuf::from("python3"));
        Sandbox::with_python(python, limits)
    }

    pub fn with_python(python: PathBuf, limits: SandboxLimits) -> Result<Sandbox, SandboxError> {
        let python = if python.is_absolute() {
            python
        } else {
            which(&python).ok_or_else(|| SandboxError::NoPython(python.clone()))?
        };
        if !python.exists() {
            return Err(SandboxError::NoPython(python));
        }
        if limits.concurrent == 0 {
            return Err(SandboxError::NoSlots);
        }
        let isolation = probe_isolation();
        let slots = Arc::new(Semaphore::new(limits.concurrent));
        Ok(Sandbox {
            python,
            limits,
            isolation,
            slots,
        })
    }

    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    pub fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// Waits for a free slot, then runs `code` on a blocking thread: once started, the async
    /// caller is never held past the wall limit plus the time to kill the tree. Dropping the
    /// future while it waits for a slot gives up its place; nothing runs.
    pub async fn run_python(&self, code: &str) -> Result<Execution, SandboxError> {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("invariant: the semaphore is never closed");
        let (this, code) = (self.clone(), code.to_owned());
        tokio::task::spawn_blocking(move || {
            let result = this.run_started(&code);
            drop(slot);
            result
        })
        .await
        .expect("invariant: the sandbox thread does not panic")
    }

    /// Waits for a free slot (polling; for callers off the async runtime), runs `code` and waits
    /// for it.
    pub fn run_python_blocking(&self, code: &str) -> Result<Execution, SandboxError> {
        let slot = loop {
            match self.slots.clone().try_acquire_owned() {
                Ok(slot) => break slot,
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let result = self.run_started(code);
        drop(slot);
        result
    }

    /// Runs `code` now, holding a slot.
    fn run_started(&self, code: &str) -> Result<Execution, SandboxError> {
        let dir = tempfile::Builder::new().prefix("ooze-sandbox-").tempdir()?;
        std::fs::write(dir.path().join("main.py"), code)?;
        let uid = match self.isolation {
            Isolation::Full => Some(
                take_uid()
                    .ok_or_else(|| std::io::Error::other("all 1024 sandbox uids are busy"))?,
            ),
            _ => None,
        };
        let result = self.run_in(dir.path(), uid);
        if let Some(uid) = uid {
            kill_uid(uid);
            // Files the program left belong to its uid; the directory is removed as root below.
            give_back_uid(uid);
        }
        drop(dir);
        result
    }

    fn run_in(&self, dir: &Path, uid: Option<u32>) -> Result<Execution, SandboxError> {
        let limits = self.limits.clone();
        if let Some(uid) = uid {
            chown(dir, uid)?;
            chown(&dir.join("main.py"), uid)?;
        }
        let mut cmd = Command::new(&self.python);
        cmd.arg("-I")
            .arg("main.py")
            .current_dir(dir)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", if uid.is_some() { "/tmp" } else { "." })
            .env("LANG", "C.UTF-8")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let setup = ChildSetup::new(dir, uid, self.isolation, &limits);
        // SAFETY: the closure only makes system calls on data prepared before the fork.
        unsafe {
            cmd.pre_exec(move || setup.apply());
        }
        let started = Instant::now();
        let mut child = cmd.spawn()?;
        let pgid = child.id() as i32;
        let overflow = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = |pipe: Option<Box<dyn Read + Send>>| {
            let overflow = overflow.clone();
            let cap = limits.output_bytes;
            std::thread::spawn(move || read_capped(pipe, cap, &overflow))
        };
        let out = reader(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let err = reader(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let mut timed_out = false;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            let over = overflow.load(std::sync::atomic::Ordering::SeqCst);
            if started.elapsed() >= limits.wall || over {
                timed_out = !over;
                kill_tree(pgid, uid);
                break child.wait()?;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // Children that outlived the main process would hold the pipes open.
        kill_tree(pgid, uid);
        let (stdout, out_cut) = out.join().expect("reader thread");
        let (stderr, err_cut) = err.join().expect("reader thread");
        Ok(Execution {
            stdout,
            stderr,
            exit_code: status.code(),
            signal: status.signal(),
            timed_out,
            output_truncated: out_cut || err_cut,
            duration: started.elapsed(),
            wall_limit: limits.wall,
        })
    }
}

/// Reads `pipe` keeping at most `cap` bytes; past it, raises `overflow` (the waiter then stops the
/// program) and discards the rest.
fn read_capped(
    pipe: Option<Box<dyn Read + Send>>,
    cap: usize,
    overflow: &std::sync::atomic::AtomicBool,
) -> (String, bool) {
    let Some(mut pipe) = pipe else {
        return (String::new(), false);
    };
    let mut kept = Vec::new();
    let mut cut = false;
    let mut buf = [0u8; 16 << 10];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                if n > room {
                    cut = true;
                    overflow.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            }
        }
    }
    (String::from_utf8_lossy(&kept).into_owned(), cut)
}

/// What the child does between fork and exec, prepared beforehand (no allocation after the fork).
struct ChildSetup {
    isolation: Isolation,
    uid: Option<u32>,
    limits: [(libc::__rlimit_resource_t, u64); 6],
    dir: std::ffi::CString,
    tmp: std::ffi::CString,
    root: std::ffi::CString,
    tmpfs: std::ffi::CString,
    private_dirs: [std::ffi::CString; 2],
    tmpfs_options: std::ffi::CString,
    uid_map: std::ffi::CString,
    gid_map: std::ffi::CString,
}

impl ChildSetup {
    fn new(dir: &Path, uid: Option<u32>, isolation: Isolation, l: &SandboxLimits) -> ChildSetup {
        use std::ffi::CString;
        let c = |s: &str| CString::new(s).expect("no NUL");
        let (real_uid, real_gid) = unsafe { (libc::getuid(), libc::getgid()) };
        ChildSetup {
            isolation,
            uid,
            limits: [
                (libc::RLIMIT_CPU, l.cpu_seconds),
                (libc::RLIMIT_AS, l.memory_bytes),
                (libc::RLIMIT_FSIZE, l.file_bytes),
                (libc::RLIMIT_NPROC, l.processes),
                (libc::RLIMIT_NOFILE, 256),
                (libc::RLIMIT_CORE, 0),
            ],
            dir: c(&dir.to_string_lossy()),
            tmp: c("/tmp"),
            root: c("/"),
            tmpfs: c("tmpfs"),
            private_dirs: [c("/dev/shm"), c("/var/tmp")],
            tmpfs_options: c("size=16m,mode=1777"),
            uid_map: c(&format!("0 {real_uid} 1")),
            gid_map: c(&format!("0 {real_gid} 1")),
        }
    }

    /// Runs in the child. Failures of the isolation steps that the probe said would work are
    /// errors (the program does not run unisolated); the limits always apply.
    fn apply(&self) -> std::io::Result<()> {
        let check = |r: libc::c_int| {
            if r == -1 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        unsafe {
            check(libc::setsid())?;
            match self.isolation {
                Isolation::Full => {
                    check(libc::unshare(
                        libc::CLONE_NEWNET | libc::CLONE_NEWNS | libc::CLONE_NEWIPC,
                    ))?;
                    let null = std::ptr::null();
                    check(libc::mount(
                        null,
                        self.root.as_ptr(),
                        null,
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ))?;
                    // /tmp is the sandbox's own directory; the other shared scratch places are
                    // private and small.
                    check(libc::mount(
                        self.dir.as_ptr(),
                        self.tmp.as_ptr(),
                        null,
                        libc::MS_BIND,
                        std::ptr::null(),
                    ))?;
                    for d in &self.private_dirs {
                        // Not every machine has both; a missing one is nothing to hide.
                        libc::mount(
                            self.tmpfs.as_ptr(),
                            d.as_ptr(),
                            self.tmpfs.as_ptr(),
                            libc::MS_NOSUID | libc::MS_NODEV,
                            self.tmpfs_options.as_ptr().cast(),
                        );
                    }
                    check(libc::chdir(self.tmp.as_ptr()))?;
                }
                Isolation::NetworkOnly => {
                    check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET))?;
                    write_proc(c"/proc/self/setgroups", c"deny")?;
                    write_proc(c"/proc/self/uid_map", &self.uid_map)?;
                    write_proc(c"/proc/self/gid_map", &self.gid_map)?;
                }
                Isolation::LimitsOnly => {}
            }
            for &(resource, value) in &self.limits {
                // CPU: SIGXCPU at the limit (reported as such), SIGKILL a second later.
                let hard = if resource == libc::RLIMIT_CPU {
                    value + 1
                } else {
                    value
                };
                let limit = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: hard,
                };
                check(libc::setrlimit(resource, &limit))?;
            }
            if let Some(uid) = self.uid {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setgid(uid))?;
                check(libc::setuid(uid))?;
            }
        }
        Ok(())
    }
}

/// Writes `value` to a /proc file without allocating.
pub(crate) unsafe fn write_proc(
    path: &std::ffi::CStr,
    value: &std::ffi::CStr,
) -> std::io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
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

/// Which isolation a throwaway child can set up here.
pub(crate) fn probe_isolation() -> Isolation {
    let try_child = |flags: libc::c_int, user: bool| -> bool {
        let mut cmd = Command::new("/bin/true");
        let maps = (
            std::ffi::CString::new(format!("0 {} 1", unsafe { libc::getuid() })).unwrap(),
            std::ffi::CString::new(format!("0 {} 1", unsafe { libc::getgid() })).unwrap(),
        );
        // SAFETY: system calls on data prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::unshare(flags) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                if user {
                    write_proc(c"/proc/self/setgroups", c"deny")?;
                    write_proc(c"/proc/self/uid_map", &maps.0)?;
                    write_proc(c"/proc/self/gid_map", &maps.1)?;
                }
                Ok(())
            });
        }
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let root = unsafe { libc::geteuid() } == 0;
    if root
        && try_child(
            libc::CLONE_NEWNET | libc::CLONE_NEWNS | libc::CLONE_NEWIPC,
            false,
        )
    {
        Isolation::Full
    } else if try_child(libc::CLONE_NEWUSER | libc::CLONE_NEWNET, true) {
        Isolation::NetworkOnly
    } else {
        Isolation::LimitsOnly
    }
}

fn chown(path: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(uid))
}

/// Kills the process group and, under a pool uid, every process of that uid (until none is left).
fn kill_tree(pgid: i32, uid: Option<u32>) {
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
    if let Some(uid) = uid {
        kill_uid(uid);
    }
}

/// SIGKILLs every process whose real uid is `uid`, repeating while new ones appear.
fn kill_uid(uid: u32) {
    for _ in 0..200 {
        let pids = processes_of(uid);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn processes_of(uid: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find(|l| l.starts_with("Uid:"))
                        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u32>().ok())
                })
                == Some(uid)
        })
        .collect()
}

fn which(name: &Path) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}
