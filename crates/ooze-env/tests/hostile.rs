//! The hostile suite: what a model's commands can do to a machine, each run in an episode of the
//! terminal image. Each is contained, reported in the observation, leaves nothing running after
//! the episode, and leaves the episode (or at least the sandbox) usable.

mod common;

use common::{host_processes_with, marker, sandbox, terminal_image};
use ooze_env::{Ending, Episode, EpisodeLimits, Rootfs, Sandbox};
use std::time::Duration;

fn limits() -> EpisodeLimits {
    EpisodeLimits {
        memory_bytes: 256 << 20,
        processes: 64,
        disk_bytes: 64 << 20,
        open_files: 256,
        output_bytes: 4 << 10,
        flood_bytes: 16 << 20,
        command_timeout: Duration::from_secs(5),
        ..EpisodeLimits::default()
    }
}

async fn episode() -> (Sandbox, Episode) {
    let sb = sandbox(limits()).await;
    let ep = sb.start(&Rootfs::Image(terminal_image())).await.unwrap();
    (sb, ep)
}

async fn still_answers(ep: &mut Episode) {
    let out = ep.run("echo alive", None).await.unwrap();
    assert_eq!(out.output, "alive\n", "{}", out.observation());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_hits_the_process_limit_and_is_stopped() {
    let (_sb, mut ep) = episode().await;
    let mark = marker("ooze-bomb-");
    // The bomb's copies run in the background; the command waits on them a second.
    let bomb = format!("{mark}(){{ {mark}|{mark}& }};{mark}; sleep 1; echo after");
    let out = ep.run(&bomb, Some(Duration::from_secs(3))).await.unwrap();
    let seen = out.observation();
    assert!(out.forks_refused > 0, "{seen}");
    assert!(seen.contains("PROCESS LIMIT"), "{seen}");
    // Whether the command outlived its timeout or not, the episode answers again: a stopped
    // command takes the bomb's copies down with it, and the timeout stops a live one. Copies
    // that live on (the command ended in time) share the output pipe, so their fork errors may
    // come before or after the answer.
    let mut outputs = Vec::new();
    for _ in 0..3 {
        let out = ep
            .run("echo alive", Some(Duration::from_secs(2)))
            .await
            .unwrap();
        if out.ending == Ending::Exited(0) && out.output.contains("alive\n") {
            break;
        }
        outputs.push(out.observation());
    }
    assert!(
        outputs.len() < 3,
        "the episode never answered after the bomb: {outputs:?}"
    );
    ep.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_is_killed_at_the_memory_limit() {
    let (_sb, mut ep) = episode().await;
    let out = ep
        .run("python3 -c 'x = b\"a\" * (2 << 30); print(len(x))'", None)
        .await
        .unwrap();
    let seen = out.observation();
    assert_ne!(out.ending, Ending::Exited(0), "{seen}");
    assert!(!seen.contains("2147483648"), "{seen}");
    assert!(
        out.oom_kills > 0 || seen.contains("MemoryError"),
        "neither the OOM killer nor Python stopped it: {seen}"
    );
    still_answers(&mut ep).await;
    let report = ep.close().await;
    if let Some(peak) = report.memory_peak_bytes {
        assert!(peak <= 256 << 20, "peak {peak} over the limit");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filling_the_disk_stops_at_the_episode_quota() {
    let (_sb, mut ep) = episode().await;
    let out = ep
        .run(
            "head -c 1G /dev/zero > /work/big; ls -l /work/big | cut -d' ' -f5",
            None,
        )
        .await
        .unwrap();
    let seen = out.observation();
    assert!(seen.contains("No space left on device"), "{seen}");
    assert!(out.disk_full && seen.contains("DISK FULL"), "{seen}");
    let size: u64 = seen
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .expect("the size is printed");
    assert!(size <= 64 << 20, "{size}");
    // Freeing the space makes the episode whole again.
    let out = ep
        .run(
            "rm /work/big && echo ok > /work/small && cat /work/small",
            None,
        )
        .await
        .unwrap();
    assert_eq!(out.output, "ok\n", "{}", out.observation());
    assert!(!out.disk_full);
    ep.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_double_forked_daemon_does_not_outlive_the_episode() {
    let (_sb, mut ep) = episode().await;
    let mark = marker("ooze-daemon-");
    let cmd = format!(
        "(setsid bash -c 'exec -a {mark} sleep 1000' </dev/null >/dev/null 2>&1 &) ; \
         nohup setsid bash -c 'exec -a {mark}-2 sleep 1000' >/dev/null 2>&1 & echo started"
    );
    let out = ep.run(&cmd, None).await.unwrap();
    assert_eq!(out.output, "started\n", "{}", out.observation());
    // Between commands the daemons run (a task may start a server) ...
    let out = ep
        .run(&format!("sleep 0.2; ps -eo args | grep -c '^{mark}'"), None)
        .await
        .unwrap();
    assert_eq!(out.output.trim(), "2", "{}", out.observation());
    assert_eq!(host_processes_with(&mark).len(), 2);
    // ... and the episode's end takes them down.
    ep.close().await;
    assert_eq!(host_processes_with(&mark), Vec::<i32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausting_file_descriptors_fails_inside_only() {
    let (_sb, mut ep) = episode().await;
    let out = ep
        .run(
            "python3 -c 'fs = [open(\"/dev/null\") for _ in range(100000)]'",
            None,
        )
        .await
        .unwrap();
    let seen = out.observation();
    assert!(seen.contains("Too many open files"), "{seen}");
    assert_eq!(out.ending, Ending::Exited(1), "{seen}");
    still_answers(&mut ep).await;
    ep.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_of_output_is_cut_and_stopped() {
    let (_sb, mut ep) = episode().await;
    let out = ep.run("yes | head -c 1000000000", None).await.unwrap();
    assert_eq!(out.ending, Ending::Flooded, "{}", out.observation());
    assert!(out.output.len() < 5 << 10, "{}", out.output.len());
    assert!(out.output_bytes >= 16 << 20);
    assert!(out.observation().contains("OUTPUT FLOOD"));
    still_answers(&mut ep).await;
    // Under the flood limit, output is cut to its ends and the command finishes.
    let out = ep.run("seq 1 100000", None).await.unwrap();
    assert_eq!(out.ending, Ending::Exited(0));
    assert!(out.output.starts_with("1\n2\n"), "{}", &out.output[..20]);
    assert!(out.output.ends_with("99999\n100000\n"));
    assert!(out.output.contains("bytes of output cut"));
    ep.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_files_are_out_of_reach() {
    let secret_dir = tempfile::tempdir().unwrap();
    let mark = marker("ooze-secret-");
    std::fs::write(secret_dir.path().join("secret.txt"), &mark).unwrap();
    let (_sb, mut ep) = episode().await;
    let probe = format!(
        "cat {0}/secret.txt; ls /root /home; cat /proc/1/root{0}/secret.txt; \
         grep -rs {mark} /etc /root /home /tmp /work /var /opt; \
         find / -xdev -name secret.txt 2>/dev/null; cat /etc/hostname; echo done",
        secret_dir.path().display()
    );
    let out = ep.run(&probe, None).await.unwrap();
    assert!(out.output.contains("done"), "{}", out.observation());
    assert!(!out.output.contains(&mark), "{}", out.observation());
    // The host's repository is not there either.
    let out = ep
        .run("ls / ; test -e /work/main && echo HOST-REPO", None)
        .await
        .unwrap();
    assert!(!out.output.contains("HOST-REPO"), "{}", out.observation());
    ep.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_on_the_host_cannot_be_reached() {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    // The host's own outward address, when it has one.
    let outward = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("10.255.255.1:9")?;
            s.local_addr()
        })
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "127.0.0.1".into());
    let (_sb, mut ep) = episode().await;
    let script = format!(
        "import socket\n\
         for host in ['127.0.0.1', '{outward}']:\n\
         \x20   try:\n\
         \x20       socket.create_connection((host, {port}), timeout=2); print('CONNECTED', host)\n\
         \x20   except OSError as e: print('refused', host, e)\n\
         print(open('/proc/net/dev').read())"
    );
    ep.put("net.py", script.as_bytes(), 0o644).unwrap();
    let out = ep.run("python3 net.py", None).await.unwrap();
    let seen = out.observation();
    assert!(!seen.contains("CONNECTED"), "{seen}");
    assert_eq!(
        seen.lines().filter(|l| l.starts_with("refused")).count(),
        2,
        "{seen}"
    );
    // Only loopback exists.
    let interfaces: Vec<&str> = seen
        .lines()
        .filter(|l| !l.contains('|') && !l.starts_with("refused"))
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
        .collect();
    assert_eq!(interfaces, ["lo"], "{seen}");
    assert!(listener.accept().is_err(), "the host listener was reached");
    ep.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_and_proc_lead_nowhere_outside() {
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let (_sb, mut ep) = episode().await;
    let out = ep
        .run(
            "ln -s /etc/passwd /work/to-passwd; ln -s ../../../../../../../../etc /work/up; \
             ln -s /proc/1/root /work/init-root; \
             echo changed > /proc/sys/kernel/hostname; echo 1 > /proc/sys/vm/drop_caches; \
             [ -w /proc/sysrq-trigger ] || echo sysrq-read-only; \
             python3 -c 'import ctypes; l = ctypes.CDLL(None); print(\"mount\", l.mount(b\"proc\", b\"/mnt\", b\"proc\", 0, None))'; \
             ls /proc/1/root/ | head -3; ls /sys 2>&1 | head -2; echo done",
            None,
        )
        .await
        .unwrap();
    let seen = out.observation();
    assert!(seen.contains("done"), "{seen}");
    assert_eq!(seen.matches("Read-only file system").count(), 2, "{seen}");
    assert!(seen.contains("sysrq-read-only"), "{seen}");
    assert!(
        seen.contains("mount -1"),
        "mounting needs a capability episodes lack: {seen}"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        host_name
    );
    // Files ooze reads through the agent's links are the episode's own.
    let passwd = ep.get("to-passwd", 1 << 20).unwrap();
    assert!(String::from_utf8_lossy(&passwd).contains("agent:x:1000"));
    let via_up = ep.get("up/passwd", 1 << 20).unwrap();
    assert_eq!(via_up, passwd);
    assert!(
        ep.get("init-root/etc/passwd", 1 << 20).is_err(),
        "magic links are not followed"
    );
    // A link planted where ooze writes does not carry the write to the host.
    ep.run("ln -sf /tmp/ooze-written-through /work/target", None)
        .await
        .unwrap();
    ep.put("target", b"x", 0o644).unwrap();
    assert!(!std::path::Path::new("/tmp/ooze-written-through").exists());
    let out = ep.run("cat /tmp/ooze-written-through", None).await.unwrap();
    assert_eq!(out.output, "x");
    ep.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_never_return_are_stopped_at_their_timeout() {
    let (_sb, mut ep) = episode().await;
    let mark = marker("ooze-forever-");
    for cmd in [
        "while :; do :; done".to_string(),
        format!("bash -c 'exec -a {mark} sleep infinity'"),
        "read line < /dev/tty".to_string(),
        "cat".to_string(),
    ] {
        let out = ep
            .run(&cmd, Some(Duration::from_millis(700)))
            .await
            .unwrap();
        let seen = out.observation();
        assert!(
            out.ending == Ending::TimedOut
                || matches!(out.ending, Ending::Exited(c) if c != 0)
                || cmd == "cat",
            "{cmd}: {seen}"
        );
        if out.ending == Ending::TimedOut {
            assert!(seen.contains("TIMEOUT"), "{seen}");
            assert!(out.duration >= Duration::from_millis(700));
        }
        still_answers(&mut ep).await;
    }
    assert_eq!(host_processes_with(&mark), Vec::<i32>::new());
    let report = ep.close().await;
    assert!(report.timeouts >= 2, "{report:?}");
}
