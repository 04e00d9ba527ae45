//! Starting programs without copying this process: `clone(CLONE_VM | CLONE_VFORK)`, the way
//! `posix_spawn` starts them, with a hook that runs in the child before `exec` (what
//! `CommandExt::pre_exec` gives, which forces the standard library onto `fork`).
//!
//! Why: `fork` copies the page tables of every private mapping and write-protects the parent's
//! memory until the child execs. In a trainer holding gigabytes (a CUDA context, the model, the
//! rollout buffers) each fork stalls the whole process for tens of milliseconds, and an agent
//! workload starts dozens of programs a second: on two H200s, 64 agent programs started after
//! each weight update left the engine idle for 1.5–2 s of every 3 s step (docs/asynchronous.md).
//! Here the child shares the parent's memory until it execs; the calling thread waits for that,
//! the others run on.
//!
//! The child runs on its own stack with every signal blocked and default handlers, so nothing of
//! the parent's runs in it; the hook must make async-signal-safe calls only (no allocation).
//! The exit is watched through a pidfd and the child reaped here; a [`Child`] dropped before its
//! exit kills it.

use crate::launch::pipe;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe as async_pipe;

/// The child's stack until it execs (the hook's frames and `execve`'s).
const CHILD_STACK_BYTES: usize = 256 << 10;
/// Signal numbers on Linux are below this (`NSIG`).
const SIGNALS: libc::c_int = 65;

/// A program to start: its path or name (searched on the child's `PATH`), arguments, the
/// variables set beside this process's environment, and its working directory.
#[derive(Debug, Clone)]
pub struct Program {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
}

/// A started program with piped standard input, output and error.
#[derive(Debug)]
pub struct Child {
    pid: libc::pid_t,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
    pub stdin: Option<async_pipe::Sender>,
    pub stdout: Option<async_pipe::Receiver>,
    pub stderr: Option<async_pipe::Receiver>,
}

impl Program {
    pub fn new(program: impl AsRef<OsStr>) -> Program {
        Program {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
        }
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(&mut self, args: I) -> &mut Program {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets `key` in the child's environment (the last setting of a key wins).
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Program {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Program
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (k, v) in vars {
            self.env(k, v);
        }
        self
    }

    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Program {
        self.cwd = Some(dir.as_ref().to_owned());
        self
    }

    /// The child's environment: this process's, with this program's settings over it.
    fn environment(&self) -> Vec<(OsString, OsString)> {
        let mut vars: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        for (k, v) in &self.env {
            vars.retain(|(key, _)| key != k);
            vars.push((k.clone(), v.clone()));
        }
        vars
    }

    /// Where the program is: as given when it names a path, else the first executable of that
    /// name on the child's `PATH` (as `execvp` would find it).
    fn resolve(&self, vars: &[(OsString, OsString)]) -> io::Result<OsString> {
        if self.program.as_bytes().contains(&b'/') {
            return Ok(self.program.clone());
        }
        let path = vars.iter().find(|(k, _)| k == "PATH").map_or_else(
            || OsString::from("/usr/local/bin:/usr/bin:/bin"),
            |(_, v)| v.clone(),
        );
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(&self.program);
            let Ok(c) = CString::new(candidate.as_os_str().as_bytes()) else {
                continue;
            };
            // SAFETY: a valid C string.
            if candidate.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 {
                return Ok(candidate.into_os_string());
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{:?} is not an executable on PATH", self.program),
        ))
    }

    /// Starts the program. `hook` runs in the child just before `exec`; an error from it (an OS
    /// error) is this call's error, and the child does not run the program.
    ///
    /// # Safety
    /// `hook` runs in a child that shares this process's memory: async-signal-safe calls only,
    /// nothing allocated or locked.
    pub unsafe fn spawn(
        &self,
        hook: &mut (dyn FnMut() -> io::Result<()> + Send),
    ) -> io::Result<Child> {
        let vars = self.environment();
        let path = self.resolve(&vars)?;
        let c = |s: &OsStr| {
            CString::new(s.as_bytes()).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{s:?} contains a NUL byte"),
                )
            })
        };
        let path = c(&path)?;
        let argv: Vec<CString> = std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| c(a))
            .collect::<io::Result<_>>()?;
        let envp: Vec<CString> = vars
            .iter()
            .map(|(k, v)| {
                let mut kv = k.clone();
                kv.push("=");
                kv.push(v);
                c(&kv)
            })
            .collect::<io::Result<_>>()?;
        let cwd = self.cwd.as_ref().map(|d| c(d.as_os_str())).transpose()?;
        let argv_ptrs: Vec<*const libc::c_char> = argv
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp_ptrs: Vec<*const libc::c_char> = envp
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let (stdin_r, stdin_w) = pipe()?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let mut args = ChildArgs {
            path: &path,
            argv: argv_ptrs.as_ptr(),
            envp: envp_ptrs.as_ptr(),
            cwd: cwd.as_deref(),
            stdio: [
                stdin_r.as_raw_fd(),
                stdout_w.as_raw_fd(),
                stderr_w.as_raw_fd(),
            ],
            hook,
            error: AtomicI32::new(0),
        };
        let mut stack = vec![0u8; CHILD_STACK_BYTES];
        // The stack grows down from its 16-byte-aligned top.
        let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
        let mut pidfd: libc::c_int = -1;
        // No signal handler of this process may run in the child: all are blocked across the
        // clone, and the child sets default handlers before unblocking.
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut saved: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut saved);
        let pid = libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            (&raw mut args).cast(),
            &raw mut pidfd,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut());
        drop(stack);
        if pid == -1 {
            if clone_error.raw_os_error() == Some(libc::EINVAL) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD) refused ({clone_error}): Linux 5.2 or later is needed"),
                ));
            }
            return Err(clone_error);
        }
        // SAFETY: the clone succeeded, so the kernel wrote a new pidfd.
        let pidfd = OwnedFd::from_raw_fd(pidfd);
        // The child has exec'd or exited: its ends of the pipes are its own now.
        drop((stdin_r, stdout_w, stderr_w));
        let error = args.error.load(Ordering::SeqCst);
        if error != 0 {
            let _ = reap(pid, 0);
            return Err(io::Error::from_raw_os_error(error));
        }
        let child = || -> io::Result<Child> {
            Ok(Child {
                pid,
                // SAFETY: a pidfd this `AsyncFd` owns from here on.
                pidfd: AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)?,
                status: None,
                stdin: Some(async_pipe::Sender::from_owned_fd(stdin_w)?),
                stdout: Some(async_pipe::Receiver::from_owned_fd(stdout_r)?),
                stderr: Some(async_pipe::Receiver::from_owned_fd(stderr_r)?),
            })
        };
        child().inspect_err(|_| {
            // The program runs and nothing here could follow it: it goes.
            libc::kill(pid, libc::SIGKILL);
            let _ = reap(pid, 0);
        })
    }
}

/// What the child needs, prepared by the parent (the child allocates nothing).
struct ChildArgs<'a> {
    path: &'a CStr,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: Option<&'a CStr>,
    stdio: [RawFd; 3],
    hook: &'a mut (dyn FnMut() -> io::Result<()> + Send),
    /// The errno of the step that failed, for the parent (0: the program was exec'd).
    error: AtomicI32,
}

/// The child, until `execve`: default signal handlers, no blocked signal, the pipes as its
/// standard streams, the working directory, the hook.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive while the parent waits (CLONE_VFORK).
    let args = unsafe { &mut *arg.cast::<ChildArgs>() };
    let fail = |args: &ChildArgs, errno: i32| -> libc::c_int {
        args.error.store(errno.max(1), Ordering::SeqCst);
        // SAFETY: ends the child without running anything of the parent's.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: system calls on values prepared before the clone.
    unsafe {
        for signal in 1..SIGNALS {
            let mut action: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut action) == 0
                && action.sa_sigaction != libc::SIG_IGN
                && action.sa_sigaction != libc::SIG_DFL
            {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
        // The standard library ignores SIGPIPE in this process; programs expect the default.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        for (target, &fd) in args.stdio.iter().enumerate() {
            if libc::dup2(fd, target as RawFd) == -1 {
                return fail(args, errno());
            }
        }
        if let Some(dir) = args.cwd {
            if libc::chdir(dir.as_ptr()) == -1 {
                return fail(args, errno());
            }
        }
        if let Err(e) = (args.hook)() {
            return fail(args, e.raw_os_error().unwrap_or(libc::EINVAL));
        }
        libc::execve(args.path.as_ptr(), args.argv, args.envp);
        fail(args, errno())
    }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

/// `waitpid` for `pid`: its status once it has exited (`flags` 0 waits for that).
fn reap(pid: libc::pid_t, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child.
        match unsafe { libc::waitpid(pid, &mut status, flags) } {
            -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
            -1 => return Err(io::Error::last_os_error()),
            0 => return Ok(None),
            _ => return Ok(Some(ExitStatus::from_raw(status))),
        }
    }
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Waits for the program to exit (cancel-safe).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            let mut ready = self.pidfd.readable().await?;
            match reap(self.pid, libc::WNOHANG)? {
                Some(status) => self.status = Some(status),
                None => ready.clear_ready(),
            }
        }
    }

    /// Sends SIGKILL, unless the program has been reaped already (its pid may be another's).
    pub fn kill(&self) {
        if self.status.is_none() {
            // SAFETY: the pidfd names exactly this process, reaped or not.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    self.pidfd.get_ref().as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
        }
    }
}

impl Drop for Child {
    /// A program not waited for is killed, and reaped on a thread of its own.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        self.kill();
        let pid = self.pid;
        if !matches!(reap(pid, libc::WNOHANG), Ok(Some(_)) | Err(_)) {
            std::thread::spawn(move || reap(pid, 0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn output(child: &mut Child) -> (String, String) {
        let (mut out, mut err) = (String::new(), String::new());
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .await
            .unwrap();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .await
            .unwrap();
        (out, err)
    }

    #[tokio::test]
    async fn a_program_gets_its_arguments_environment_directory_and_streams() {
        let dir = tempfile::tempdir().unwrap();
        let mut program = Program::new("sh");
        program
            .args([
                "-c",
                "read line; echo \"$line $OOZE_X $(pwd) $0\"; echo err >&2; exit 3",
                "zero",
            ])
            .env("OOZE_X", "first")
            .env("OOZE_X", "second")
            .current_dir(dir.path());
        // SAFETY: the hook makes no call at all.
        let mut child = unsafe { program.spawn(&mut || Ok(())) }.unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"hello\n").await.unwrap();
        drop(stdin);
        let (out, err) = output(&mut child).await;
        let status = child.wait().await.unwrap();
        let cwd = dir.path().canonicalize().unwrap();
        assert_eq!(out.trim(), format!("hello second {} zero", cwd.display()));
        assert_eq!(err.trim(), "err");
        assert_eq!(status.code(), Some(3));
    }

    #[tokio::test]
    async fn the_hook_runs_in_the_child_and_its_error_is_the_spawns() {
        let mut program = Program::new("sh");
        program.args(["-c", "cut -d' ' -f6 /proc/$$/stat; echo $$"]);
        // SAFETY: setsid only.
        let mut child = unsafe {
            program.spawn(&mut || {
                if libc::setsid() == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            })
        }
        .unwrap();
        let (out, _) = output(&mut child).await;
        assert!(child.wait().await.unwrap().success());
        let lines: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[0], lines[1], "the program leads its own session");
        // SAFETY: returns an OS error without a call.
        let refused =
            unsafe { program.spawn(&mut || Err(io::Error::from_raw_os_error(libc::EPERM))) };
        assert_eq!(refused.unwrap_err().raw_os_error(), Some(libc::EPERM));
        let missing = unsafe { Program::new("/nonexistent/ooze-program").spawn(&mut || Ok(())) };
        assert_eq!(missing.unwrap_err().kind(), io::ErrorKind::NotFound);
        let unnamed = unsafe { Program::new("ooze-no-such-program").spawn(&mut || Ok(())) };
        assert_eq!(unnamed.unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn a_killed_or_dropped_program_ends_and_is_reaped() {
        let mut program = Program::new("sleep");
        program.args(["30"]);
        let mut child = unsafe { program.spawn(&mut || Ok(())) }.unwrap();
        child.kill();
        let status = child.wait().await.unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        let dropped = unsafe { program.spawn(&mut || Ok(())) }.unwrap();
        let pid = dropped.id() as libc::pid_t;
        drop(dropped);
        // Reaped by the drop's thread: the pid stops naming a process (kill fails with ESRCH).
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            (unsafe { libc::kill(pid, 0) }) == -1
        });
        assert!(
            gone,
            "the dropped program {pid} was neither killed nor reaped"
        );
    }
}
