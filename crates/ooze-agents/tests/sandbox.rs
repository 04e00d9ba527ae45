//! The sandbox against hostile programs: each is contained, reported in the observation, and the
//! call returns within its wall limit (plus the time to kill the tree).

use ooze_agents::sandbox::{Isolation, Sandbox, SandboxLimits};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn sandbox() -> Sandbox {
    let sandbox = Sandbox::new(SandboxLimits {
        wall: Duration::from_secs(3),
        cpu_seconds: 2,
        memory_bytes: 512 << 20,
        output_bytes: 16 << 10,
        file_bytes: 1 << 20,
        processes: 32,
        concurrent: 4,
    })
    .unwrap();
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(
            sandbox.isolation(),
            Isolation::Full,
            "root gets full isolation"
        );
    }
    sandbox
}

/// Runs `code`, checking the call came back in bounded time.
fn run(code: &str) -> ooze_agents::sandbox::Execution {
    let started = Instant::now();
    let e = sandbox().run_python_blocking(code).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    e
}

#[test]
fn a_plain_program_runs() {
    let e = run("import sys\nprint(sum(range(10)))\nprint('warn', file=sys.stderr)\n");
    assert!(e.success(), "{e:?}");
    assert_eq!(e.stdout, "45\n");
    assert_eq!(e.observation(), "45\nwarn\n");
    let e = run("raise ValueError('bad input')\n");
    assert_eq!(e.exit_code, Some(1));
    let obs = e.observation();
    assert!(
        obs.contains("ValueError: bad input") && obs.ends_with("exit code 1"),
        "{obs}"
    );
}

#[test]
fn an_infinite_loop_is_stopped() {
    let e = run("while True:\n    pass\n");
    assert!(!e.success());
    // The CPU limit (2 s) or the wall clock (3 s), whichever comes first.
    assert!(e.timed_out || e.signal == Some(24), "{e:?}");
    let obs = e.observation();
    assert!(
        obs.contains("CPU time limit exceeded") || obs.contains("TIMEOUT"),
        "{obs}"
    );
}

#[test]
fn a_program_that_never_returns_is_killed_at_the_wall_limit() {
    let e = run("import threading\nprint('waiting', flush=True)\nthreading.Event().wait()\n");
    assert!(e.timed_out, "{e:?}");
    assert_eq!(e.stdout, "waiting\n");
    assert!(
        e.observation()
            .contains("TIMEOUT: still running at the 3.0 s limit, stopped"),
        "{}",
        e.observation()
    );
}

#[test]
fn a_fork_bomb_is_contained() {
    let e = run(
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError as err:\n    print('fork failed after', n, type(err).__name__, flush=True)\ntime.sleep(60)\n",
    );
    assert!(e.stdout.starts_with("fork failed after"), "{e:?}");
    let n: usize = e.stdout.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(n < 32, "{n} processes were created under a limit of 32");
    assert!(e.timed_out);
}

#[test]
fn a_memory_bomb_fails_inside_the_sandbox() {
    let e = run("x = bytearray(4 << 30)\nprint('allocated')\n");
    assert!(!e.success());
    assert!(e.stderr.contains("MemoryError"), "{e:?}");
}

#[test]
fn a_gigabyte_of_output_is_cut() {
    let e = run(
        "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
    );
    assert!(
        e.output_truncated,
        "{:?}",
        (e.exit_code, e.signal, e.stdout.len())
    );
    assert_eq!(e.stdout.len(), 16 << 10);
    assert!(e.observation().contains("TRUNCATED"));
}

#[test]
fn the_network_is_unreachable() {
    // A server on this machine's loopback: reachable from any process that shares the network.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sandbox = sandbox();
    if sandbox.isolation() == Isolation::LimitsOnly {
        eprintln!("skipped: this machine allows no network namespace");
        return;
    }
    let e = sandbox
        .run_python_blocking(&format!(
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\nexcept OSError as err:\n    print('refused', err)\n"
        ))
        .unwrap();
    assert!(e.stdout.starts_with("refused"), "{e:?}");
}

/// Where the sandbox sees the host's files: not under `/tmp` (its own directory inside the sandbox)
/// nor `/dev/shm` or `/var/tmp` (private there).
fn visible_in_the_sandbox(dir: &Path) -> bool {
    !["/tmp", "/dev/shm", "/var/tmp"]
        .iter()
        .any(|private| dir.starts_with(private))
}

/// The first of `candidates` that exists and that the sandbox sees as it is.
fn first_visible(candidates: &[Option<PathBuf>]) -> Option<PathBuf> {
    candidates
        .iter()
        .flatten()
        .filter_map(|d| d.canonicalize().ok())
        .find(|d| visible_in_the_sandbox(d))
}

/// A directory of the host that the sandbox sees as it is, whatever the checkout's location: the
/// cargo target's scratch directory, unless that lies under a directory the sandbox has its own
/// copy of (a checkout under /tmp), then the home directory.
fn outside_the_sandbox() -> tempfile::TempDir {
    let dir = first_visible(&[
        Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR"))),
        std::env::var_os("HOME").map(PathBuf::from),
        Some(PathBuf::from("/root")),
    ])
    .expect("a directory outside /tmp, /dev/shm and /var/tmp");
    tempfile::tempdir_in(dir).unwrap()
}

#[test]
fn writes_stay_in_its_directory() {
    let sandbox = sandbox();
    if sandbox.isolation() != Isolation::Full {
        eprintln!("skipped: file isolation needs root (this process is not)");
        return;
    }
    // Root owns it (mode 0700) and the sandbox sees it at this path, so only the sandbox's own user
    // id stands between the program and the file: denied with EACCES, PermissionError.
    let outside = outside_the_sandbox();
    let target = outside.path().join("escaped.txt");
    let name = format!("ooze-sandbox-escape-{}.txt", std::process::id());
    let e = sandbox
        .run_python_blocking(&format!(
            "import os\nopen('here.txt', 'w').write('ok')\nopen('/tmp/{name}', 'w').write('tmp')\ntry:\n    open({target:?}, 'w').write('x')\n    print('wrote outside')\nexcept OSError as err:\n    print('denied', type(err).__name__)\nprint(sorted(os.listdir('.')))\n",
        ))
        .unwrap();
    assert!(!target.exists(), "the write landed outside: {e:?}");
    assert!(e.stdout.starts_with("denied PermissionError"), "{e:?}");
    assert!(
        e.stdout.contains("'here.txt'") && e.stdout.contains(&name),
        "{e:?}"
    );
    assert!(
        !Path::new("/tmp").join(&name).exists(),
        "/tmp is the sandbox's own"
    );
}

#[test]
fn the_outside_directory_is_outside_the_sandbox_wherever_the_checkout_is() {
    assert!(!visible_in_the_sandbox(Path::new("/tmp/clone/target/tmp")));
    assert!(!visible_in_the_sandbox(Path::new("/var/tmp/x")));
    assert!(!visible_in_the_sandbox(Path::new("/dev/shm")));
    assert!(visible_in_the_sandbox(Path::new("/work/repo/target/tmp")));
    assert!(visible_in_the_sandbox(Path::new("/tmpfoo")));
    // A checkout under /tmp: its target's scratch directory is passed over for the next candidate.
    let under_tmp = tempfile::tempdir_in("/tmp").unwrap();
    assert_eq!(
        first_visible(&[
            Some(under_tmp.path().to_path_buf()),
            None,
            Some(PathBuf::from("/nonexistent-ooze-dir")),
            Some(PathBuf::from("/")),
        ]),
        Some(PathBuf::from("/"))
    );
    assert!(visible_in_the_sandbox(outside_the_sandbox().path()));
}

#[test]
fn many_at_once_all_finish() {
    let sandbox = sandbox();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let results = rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..48 {
            let s = sandbox.clone();
            let code = if i % 4 == 0 {
                "while True: pass\n".to_string()
            } else {
                format!("print({i} * 2)\n")
            };
            tasks.spawn(async move { (i, s.run_python(&code).await.unwrap()) });
        }
        let mut out = Vec::new();
        while let Some(r) = tasks.join_next().await {
            out.push(r.unwrap());
        }
        out
    });
    assert_eq!(results.len(), 48);
    for (i, e) in results {
        if i % 4 == 0 {
            assert!(!e.success());
        } else {
            assert_eq!(e.stdout, format!("{}\n", i * 2), "{e:?}");
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

/// With two slots, six programs that each sleep 0.6 s under a 1.5 s wall limit never run more than
/// two at a time, and all finish: a queued program's wall clock starts when it runs.
#[test]
fn programs_beyond_the_slots_wait_and_keep_their_wall_clock() {
    let sandbox = Sandbox::new(SandboxLimits {
        wall: Duration::from_millis(1500),
        concurrent: 2,
        ..Default::default()
    })
    .unwrap();
    let program = "import time\nstart = time.time()\ntime.sleep(0.6)\nprint(start, time.time())\n";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let runs = rt.block_on(futures_util::future::join_all(
        (0..6).map(|_| sandbox.run_python(program)),
    ));
    let mut spans = Vec::new();
    for run in runs {
        let e = run.unwrap();
        assert!(e.success(), "{e:?}");
        let times: Vec<f64> = e
            .stdout
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        spans.push((times[0], times[1]));
    }
    for &(start, _) in &spans {
        // The programs running at the instant this one started (itself included).
        let running = spans
            .iter()
            .filter(|&&(s, e)| s <= start && start < e)
            .count();
        assert!(running <= 2, "{running} programs ran at once: {spans:?}");
    }
    // Each program is timed from its own start, though the last ones were queued past 1.5 s.
    let first = spans.iter().map(|s| s.0).fold(f64::INFINITY, f64::min);
    let last = spans.iter().map(|s| s.1).fold(0.0, f64::max);
    assert!(
        last - first > 1.5,
        "the six runs overlapped more than two slots allow: {spans:?}"
    );
}

#[test]
fn zero_slots_is_refused() {
    let err = Sandbox::new(SandboxLimits {
        concurrent: 0,
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("concurrent"), "{err}");
}
