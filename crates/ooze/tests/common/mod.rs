//! Shared by the integration tests that start `ooze serve`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// A running `ooze serve`, stopped when dropped.
pub struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ooze serve --model MODEL` on the CPU on a free port with `extra` flags; returns it with
/// its OpenAI base URL. Its log keeps being read, so the server never writes into a closed pipe.
pub fn serve(model: &Path, extra: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ooze"))
        .args(["serve", "--port", "0", "--device", "cpu"])
        .args(extra)
        .arg("--model")
        .arg(model)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let server = Server(child);
    let addr = loop {
        let line = lines.next().expect("ooze serve exited").unwrap();
        // "… listening on http://ADDR (at most N connections)"
        if let Some(addr) = line.split("on http://").nth(1) {
            break addr
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (server, format!("http://{addr}/v1"))
}
