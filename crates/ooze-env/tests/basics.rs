//! Episodes on the host's own system directories: the shell, files, timeouts, restarts.

use ooze_env::{Ending, EpisodeLimits, IsolationMode, Rootfs, Sandbox};
use std::time::Duration;

async fn sandbox() -> Sandbox {
    Sandbox::new(IsolationMode::Container, EpisodeLimits::default())
        .expect("bubblewrap and namespaces (CI installs bubblewrap)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_keeps_its_directory_and_variables() {
    let sb = sandbox().await;
    eprintln!("isolation: {}", sb.isolation());
    let mut ep = sb.start(&Rootfs::Host).await.unwrap();

    let out = ep
        .run(
            "mkdir -p /work/a && cd /work/a && export GREETING=hello",
            None,
        )
        .await
        .unwrap();
    assert!(out.success(), "{}", out.observation());
    let out = ep
        .run("pwd; echo $GREETING; echo oops >&2; false", None)
        .await
        .unwrap();
    assert_eq!(out.output, "/work/a\nhello\noops\n");
    assert_eq!(out.ending, Ending::Exited(1));
    ep.put("notes/x.txt", b"put in\n", 0o644).unwrap();
    let out = ep
        .run("cat /work/notes/x.txt; echo made > /work/a/y.txt", None)
        .await
        .unwrap();
    assert_eq!(out.output, "put in\n");
    assert_eq!(ep.get("a/y.txt", 100).unwrap(), b"made\n");
    let out = ep
        .run("sleep 5", Some(Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(out.ending, Ending::TimedOut, "{}", out.observation());
    // The shell is frozen before its child dies, so it never reports the kill ("… Killed sleep 5").
    assert_eq!(out.output, "", "{}", out.observation());
    let out = ep.run("pwd; echo $GREETING", None).await.unwrap();
    assert_eq!(out.output, "/work/a\nhello\n", "{}", out.observation());
    let out = ep.run("exit 3", None).await.unwrap();
    assert_eq!(out.ending, Ending::ShellExited(3));
    let out = ep.run("echo back", None).await.unwrap();
    assert_eq!(out.output, "back\n");
    let report = ep.close().await;
    eprintln!("{report:?}");
}
