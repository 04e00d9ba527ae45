//! Several ranks for one command: `--nproc-per-node N` starts N copies of this command on this
//! machine with torchrun's environment contract, and a command started that way (or by torchrun,
//! or by a Slurm script exporting the same variables) joins its ranks' process group: Gloo on
//! CPUs, NCCL on GPUs, each rank on the GPU of its `LOCAL_RANK`.

use anyhow::{bail, Context};
use ooze_torch::dist::{Backend, ProcessGroup, Rendezvous};
use ooze_torch::tch::Device;
use ooze_torch::DeviceSpec;
use std::process::{Child, Command};
use std::sync::Arc;
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
    for rank in 0..n {
        let child = Command::new(&exe)
            .args(rank_args())
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .spawn();
        match child {
            Ok(c) => children.push((rank, c)),
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
    match failed {
        Some((rank, status)) => {
            bail!("rank {rank} of {n} failed ({status}); the others were stopped")
        }
        None => Ok(()),
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
