//! Several ranks for one command: `--nproc-per-node N` starts N copies of this command on this
//! machine with torchrun's environment contract, and a command started that way (or by torchrun,
//! or by a Slurm script exporting the same variables) joins its ranks' process group: Gloo on
//! CPUs, NCCL on GPUs, each rank on the GPU of its `LOCAL_RANK`.
//!
//! The launched ranks' standard error comes back through pipes and is written out a whole line at
//! a time (`[rank R] ` before the lines of every rank but 0), so the ranks' lines never cut into
//! each other: each rank's `eprintln!` is several writes, which another rank's could land between.

use anyhow::{bail, Context};
use ooze_run::progress::STDERR_IS_TERMINAL;
use ooze_torch::dist::{Backend, ProcessGroup, Rendezvous};
use ooze_torch::tch::Device;
use ooze_torch::DeviceSpec;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct RankArgs {
    /// Start this many ranks on this machine (plain data parallelism: each holds the model and
    /// runs its share of every step), as `torchrun --nproc-per-node N` would.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub nproc_per_node: Option<u16>,
    /// How long a rank waits for the others (joining, and each collective).
    #[arg(long, default_value_t = 600)]
    pub rank_timeout_secs: u64,
}

/// This process's ranks, joined: the group (None for a single process) and the device it
/// computes on.
pub struct Ranks {
    pub group: Option<Arc<ProcessGroup>>,
    pub device: Device,
}

/// Starts `args.nproc_per_node` ranks of this very command line and waits for them, when asked
/// (returns `Some` with the job's outcome); `None` when this process should run the command.
pub fn launch(args: &RankArgs) -> Option<anyhow::Result<()>> {
    let n = args.nproc_per_node?;
    Some(launch_ranks(usize::from(n), "--nproc-per-node"))
}

/// Starts `n` ranks of this very command line (asked for by `what`) and waits for them.
pub fn launch_ranks(n: usize, what: &str) -> anyhow::Result<()> {
    if let Ok(world) = std::env::var("WORLD_SIZE") {
        bail!(
            "{what} {n}: this process is already a rank of a launched job (WORLD_SIZE={world}); \
             leave the flag out under torchrun or Slurm"
        );
    }
    run_ranks(n)
}

/// The command line without `--nproc-per-node N` / `--nproc-per-node=N`.
fn rank_args() -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in std::env::args_os().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        match a.to_str() {
            Some("--nproc-per-node") => skip = true,
            Some(s) if s.starts_with("--nproc-per-node=") => {}
            _ => out.push(a),
        }
    }
    out
}

fn run_ranks(n: usize) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding this program to start its ranks")?;
    let port = ooze_torch::dist::free_port("127.0.0.1")
        .context("finding a free port for the ranks' rendezvous")?;
    eprintln!("ranks: starting {n} on this machine (rendezvous 127.0.0.1:{port})");
    let mut children: Vec<(usize, Child)> = Vec::new();
    let mut relays = Vec::new();
    let terminal = std::io::stderr().is_terminal();
    for rank in 0..n {
        let mut command = Command::new(&exe);
        command
            .args(rank_args())
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .stderr(Stdio::piped());
        if terminal {
            command.env(STDERR_IS_TERMINAL, "1");
        }
        match command.spawn() {
            Ok(mut c) => {
                if let Some(err) = c.stderr.take() {
                    relays.push(relay(rank, err));
                }
                children.push((rank, c));
            }
            Err(e) => {
                stop(&mut children);
                return Err(e).with_context(|| format!("starting rank {rank} ({})", exe.display()));
            }
        }
    }
    // The first rank to fail ends the job: the others would wait for it until their timeout.
    let mut failed = None;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait() {
                Ok(Some(status)) => {
                    let (rank, _) = children.remove(i);
                    if !status.success() && failed.is_none() {
                        failed = Some((rank, status));
                        stop(&mut children);
                    }
                }
                Ok(None) => i += 1,
                Err(e) => return Err(e).context("waiting for the ranks"),
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // What the ranks wrote is out before the job's outcome. A process a rank left behind may
    // hold its pipe open: that one is not waited for past a few seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while relays.iter().any(|r| !r.is_finished()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    match failed {
        Some((rank, status)) => {
            bail!("rank {rank} of {n} failed ({status}); the others were stopped")
        }
        None => Ok(()),
    }
}

/// Copies a rank's standard error to this process's on a thread of its own ([`pieces`]).
fn relay(rank: usize, from: impl Read + Send + 'static) -> JoinHandle<()> {
    std::thread::spawn(move || {
        pieces(rank, from, |piece| {
            // Writing may fail (a closed terminal): reading goes on, so the rank never blocks
            // on a full pipe.
            let _ = std::io::stderr().lock().write_all(piece);
        })
    })
}

/// Splits what a rank writes into pieces, each a line or a redraw (ended by `\n` or `\r`; a
/// last one without either gets a `\n`), and hands each to `write` whole; the pieces of ranks
/// other than 0 start with `[rank R] `.
fn pieces(rank: usize, from: impl Read, mut write: impl FnMut(&[u8])) {
    let prefix = if rank == 0 {
        Vec::new()
    } else {
        format!("[rank {rank}] ").into_bytes()
    };
    let mut reader = BufReader::new(from);
    let mut piece = prefix.clone();
    loop {
        let (used, ended) = match reader.fill_buf() {
            Ok([]) | Err(_) => break,
            Ok(buf) => match buf.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    piece.extend_from_slice(&buf[..=i]);
                    (i + 1, true)
                }
                None => {
                    piece.extend_from_slice(buf);
                    (buf.len(), false)
                }
            },
        };
        reader.consume(used);
        if ended {
            write(&piece);
            piece.clone_from(&prefix);
        }
    }
    if piece.len() > prefix.len() {
        piece.push(b'\n');
        write(&piece);
    }
}

fn stop(children: &mut [(usize, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
    }
}

/// Joins the ranks named by the environment, if any, and picks this rank's device: `device`
/// itself for one process; with ranks, the CPU (Gloo) or the GPU of `LOCAL_RANK` (NCCL).
pub fn join(device: DeviceSpec, args: &RankArgs) -> anyhow::Result<Ranks> {
    let device = device.resolve()?;
    let Some(r) = Rendezvous::from_env()? else {
        return Ok(Ranks {
            group: None,
            device,
        });
    };
    let (backend, device) = match device {
        Device::Cuda(_) => (Backend::Nccl, Device::Cuda(r.local_rank)),
        _ => (Backend::Gloo, Device::Cpu),
    };
    if let Device::Cuda(i) = device {
        let count = ooze_torch::tch::Cuda::device_count() as usize;
        if i >= count {
            bail!(
                "LOCAL_RANK={i} names GPU {i}, but this machine has {count}; start at most {count} \
                 ranks per machine"
            );
        }
    }
    let group = ProcessGroup::connect(&r, backend, Duration::from_secs(args.rank_timeout_secs))
        .with_context(|| {
            format!(
                "rank {} of {} joining its ranks over {:?}",
                r.rank, r.world_size, backend
            )
        })?;
    if r.rank == 0 {
        eprintln!(
            "ranks: {} joined over {backend:?} ({}:{})",
            r.world_size, r.master_addr, r.master_port
        );
    }
    Ok(Ranks {
        group: Some(Arc::new(group)),
        device,
    })
}

#[cfg(test)]
mod tests {
    use super::pieces;

    /// A reader that hands out one byte per read, as a pipe may.
    struct Trickle(Vec<u8>, usize);
    impl std::io::Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.1 == self.0.len() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.0[self.1];
            self.1 += 1;
            Ok(1)
        }
    }

    fn split(rank: usize, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        pieces(rank, Trickle(text.as_bytes().to_vec(), 0), |p| {
            out.push(String::from_utf8(p.to_vec()).unwrap())
        });
        out
    }

    #[test]
    fn a_rank_output_goes_out_a_whole_line_or_redraw_at_a_time() {
        let text = "trainer: sharded over 2 ranks\n\r[###--] 3/5\r[#####] 5/5\nlast words";
        assert_eq!(
            split(0, text),
            [
                "trainer: sharded over 2 ranks\n",
                "\r",
                "[###--] 3/5\r",
                "[#####] 5/5\n",
                "last words\n"
            ]
        );
        assert_eq!(
            split(1, "model: loaded\nbye\n"),
            ["[rank 1] model: loaded\n", "[rank 1] bye\n"]
        );
        assert!(split(3, "").is_empty());
    }
}
