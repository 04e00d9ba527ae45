//! Ranks and PyTorch's collectives: a [`ProcessGroup`] is c10d's `ProcessGroupGloo` (CPU tensors)
//! or `ProcessGroupNCCL` (CUDA tensors) behind a c10d `TCPStore`, through the shim
//! (`shim/dist.cpp`). [`Rendezvous::from_env`] reads torchrun's environment contract (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`, and `TORCHELASTIC_USE_AGENT_STORE`
//! when torchrun's agent already serves the store), so `torchrun … ooze …`, Slurm scripts that
//! export the same variables and `ooze … --nproc-per-node N` all start the same ranks.

use crate::tch::Tensor;
use std::time::Duration;

/// A rank's place in the job, as the launcher gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub rank: usize,
    pub world_size: usize,
    /// The rank among those on this machine: its GPU.
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// The launcher (torchrun's agent) serves the store: every rank connects as a client.
    pub agent_store: bool,
}

/// Which c10d backend carries the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// CPU tensors (`ProcessGroupGloo`).
    Gloo,
    /// CUDA tensors (`ProcessGroupNCCL`).
    Nccl,
}

impl Backend {
    /// The backend for tensors on `device`: NCCL between GPUs, Gloo between CPUs.
    pub fn for_device(device: crate::tch::Device) -> Backend {
        if device.is_cuda() {
            Backend::Nccl
        } else {
            Backend::Gloo
        }
    }
}

/// How the ranks combine their tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("environment variable {name}={value:?}: {expected}")]
    Env {
        name: &'static str,
        value: String,
        expected: String,
    },
    #[error(
        "collectives are not in this build (the PyTorch headers were not found when it was built)"
    )]
    Unavailable,
    #[error("rank {rank} of {world}: {message}")]
    Failed {
        rank: usize,
        world: usize,
        message: String,
    },
}

fn number(name: &'static str, value: String, expected: &str) -> Result<usize, DistError> {
    value.trim().parse().map_err(|_| DistError::Env {
        name,
        value,
        expected: expected.to_string(),
    })
}

impl Rendezvous {
    /// The launcher's variables, or `None` when `WORLD_SIZE` is not set (a single process).
    /// `MASTER_ADDR` defaults to 127.0.0.1 and `MASTER_PORT` to 29500 (torchrun's defaults);
    /// `LOCAL_RANK` to `RANK`.
    pub fn from_env() -> Result<Option<Rendezvous>, DistError> {
        Rendezvous::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Rendezvous::from_env`] over `lookup` (a variable's value, if set; empty counts as unset).
    pub fn from_vars(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Rendezvous>, DistError> {
        let var = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let Some(world) = var("WORLD_SIZE") else {
            return Ok(None);
        };
        let world_size = number("WORLD_SIZE", world.clone(), "a positive number of ranks")?;
        if world_size == 0 {
            return Err(DistError::Env {
                name: "WORLD_SIZE",
                value: world,
                expected: "a positive number of ranks".into(),
            });
        }
        let within = format!("a rank from 0 to {}", world_size - 1);
        let rank = match var("RANK") {
            Some(v) => number("RANK", v, &within)?,
            None => {
                return Err(DistError::Env {
                    name: "RANK",
                    value: String::new(),
                    expected: format!("set beside WORLD_SIZE={world_size}: {within}"),
                })
            }
        };
        if rank >= world_size {
            return Err(DistError::Env {
                name: "RANK",
                value: rank.to_string(),
                expected: within,
            });
        }
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => number("LOCAL_RANK", v, "a non-negative rank on this machine")?,
            None => rank,
        };
        let master_port = match var("MASTER_PORT") {
            Some(v) => {
                let port = number("MASTER_PORT", v.clone(), "a TCP port from 1 to 65535")?;
                u16::try_from(port)
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or(DistError::Env {
                        name: "MASTER_PORT",
                        value: v,
                        expected: "a TCP port from 1 to 65535".into(),
                    })?
            }
            None => 29500,
        };
        Ok(Some(Rendezvous {
            rank,
            world_size,
            local_rank,
            master_addr: var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            master_port,
            agent_store: var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True"),
        }))
    }
}

#[cfg(ooze_dist)]
mod ffi {
    use std::ffi::{c_char, c_void};
    extern "C" {
        pub fn ooze_dist_last_error() -> *const c_char;
        pub fn ooze_dist_new(
            backend: i32,
            host: *const c_char,
            port: i32,
            rank: i32,
            world: i32,
            agent_store: i32,
            timeout_ms: i64,
            prefix: *const c_char,
        ) -> *mut c_void;
        pub fn ooze_dist_free(group: *mut c_void);
        pub fn ooze_dist_all_reduce(group: *mut c_void, t: *mut c_void, op: i32) -> i32;
        pub fn ooze_dist_broadcast(group: *mut c_void, t: *mut c_void, root: i32) -> i32;
        pub fn ooze_dist_all_gather(
            group: *mut c_void,
            out: *mut c_void,
            input: *mut c_void,
        ) -> i32;
        pub fn ooze_dist_reduce_scatter(
            group: *mut c_void,
            out: *mut c_void,
            input: *mut c_void,
            op: i32,
        ) -> i32;
        pub fn ooze_dist_barrier(group: *mut c_void) -> i32;
        pub fn ooze_dist_all_gather_start(
            group: *mut c_void,
            out: *mut c_void,
            input: *mut c_void,
        ) -> *mut c_void;
        pub fn ooze_dist_reduce_scatter_start(
            group: *mut c_void,
            out: *mut c_void,
            input: *mut c_void,
            op: i32,
        ) -> *mut c_void;
        pub fn ooze_dist_wait(group: *mut c_void, work: *mut c_void) -> i32;
    }
}

/// A TCP port free on `host` now, for a group's store. It is taken below the system's ephemeral
/// range (Linux: `net.ipv4.ip_local_port_range`) when that range is known, because every socket
/// bound to port 0 in the meantime (Gloo's pair listeners, outgoing connections) gets its port
/// from that range: a port the system handed out could go to one of them before the store binds
/// it, and a store client would then connect to a socket that is not a store. Successive calls
/// in one process return different ports. Another program may still take the port before the
/// store binds it, which then fails with the port named.
pub fn free_port(host: &str) -> std::io::Result<u16> {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    const LOWEST: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&low| low > LOWEST + 1_000 && low <= 65_535);
    if let Some(low) = ephemeral_low {
        let span = low - LOWEST;
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        // A start that differs between processes (their ids), so that ranks and tests picking
        // at once rarely try the same ports; within a process the ports handed out are skipped.
        let start = std::process::id().wrapping_mul(2_654_435_761) >> 8;
        for i in 0..span.min(2_000) {
            let port = (LOWEST + (start.wrapping_add(i) % span)) as u16;
            if !handed_out.contains(&port) && std::net::TcpListener::bind((host, port)).is_ok() {
                handed_out.push(port);
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind((host, 0))?.local_addr()?.port())
}

/// How long past its timeout a group's join is waited for before it is given up
/// ([`ProcessGroup::connect`]): c10d's own waits end at the timeout, give or take its retries.
#[cfg(ooze_dist)]
fn join_margin(timeout: Duration) -> Duration {
    (timeout / 4).max(Duration::from_secs(2))
}

/// The message of the last failed shim call on this thread.
#[cfg(ooze_dist)]
fn last_error() -> String {
    // SAFETY: a thread-local NUL-terminated string set by the failing call.
    unsafe { std::ffi::CStr::from_ptr(ffi::ooze_dist_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The ranks of one job, joined. Collectives block until every rank has called them (or the
/// timeout passes: then they fail, naming this rank).
pub struct ProcessGroup {
    #[cfg_attr(not(ooze_dist), allow(dead_code))]
    raw: *mut std::ffi::c_void,
    rank: usize,
    world_size: usize,
    backend: Backend,
}

// SAFETY: c10d process groups may be used from any thread; ooze issues one collective at a time
// (`&mut self` is not needed because every call blocks until it completes).
unsafe impl Send for ProcessGroup {}
unsafe impl Sync for ProcessGroup {}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup({:?}, rank {} of {})",
            self.backend, self.rank, self.world_size
        )
    }
}

impl ProcessGroup {
    /// Joins the job's ranks: rank 0 serves the store unless the launcher does; the others
    /// connect to it, retrying until `timeout`. A join that has not ended a quarter of `timeout`
    /// (at least 2 s) after it is given up with an error, whatever c10d is waiting for.
    pub fn connect(
        rendezvous: &Rendezvous,
        backend: Backend,
        timeout: Duration,
    ) -> Result<ProcessGroup, DistError> {
        Self::connect_with_prefix(rendezvous, backend, timeout, "ooze")
    }

    /// [`ProcessGroup::connect`] with the group's keys under `prefix` in the store. A group that
    /// other programs join through `torch.distributed` under a group name `G` (SGLang's weight
    /// update group) uses the prefix `G/`, as torch does.
    pub fn connect_with_prefix(
        rendezvous: &Rendezvous,
        backend: Backend,
        timeout: Duration,
        prefix: &str,
    ) -> Result<ProcessGroup, DistError> {
        #[cfg(ooze_dist)]
        {
            let prefix = std::ffi::CString::new(prefix).map_err(|_| DistError::Env {
                name: "group_name",
                value: prefix.to_owned(),
                expected: "a name without NUL bytes".into(),
            })?;
            let host = std::ffi::CString::new(rendezvous.master_addr.clone()).map_err(|_| {
                DistError::Env {
                    name: "MASTER_ADDR",
                    value: rendezvous.master_addr.clone(),
                    expected: "a host name without NUL bytes".into(),
                }
            })?;
            let backend_code = match backend {
                Backend::Gloo => 0,
                Backend::Nccl => 1,
            };
            let (port, rank, world, agent_store) = (
                rendezvous.master_port as i32,
                rendezvous.rank as i32,
                rendezvous.world_size as i32,
                rendezvous.agent_store as i32,
            );
            let timeout_ms = timeout.as_millis().min(i64::MAX as u128) as i64;
            // c10d waits without a bound in one place: a store client that reached a socket
            // which is not a store waits forever for the answer to its first message. So the
            // join runs on its own thread and is given up after the timeout and a margin; a
            // group that still forms after that is freed by that thread.
            let (sender, receiver) = std::sync::mpsc::channel::<Result<usize, String>>();
            std::thread::Builder::new()
                .name("ooze-dist-join".into())
                .spawn(move || {
                    // SAFETY: plain values and NUL-terminated strings that live in this thread; a
                    // null result sets this thread's error.
                    let raw = unsafe {
                        ffi::ooze_dist_new(
                            backend_code,
                            host.as_ptr(),
                            port,
                            rank,
                            world,
                            agent_store,
                            timeout_ms,
                            prefix.as_ptr(),
                        )
                    };
                    let joined = if raw.is_null() {
                        Err(last_error())
                    } else {
                        Ok(raw as usize)
                    };
                    if let Err(std::sync::mpsc::SendError(Ok(raw))) = sender.send(joined) {
                        // SAFETY: a group nobody else holds, freed once.
                        unsafe { ffi::ooze_dist_free(raw as *mut std::ffi::c_void) };
                    }
                })
                .map_err(|e| DistError::Failed {
                    rank: rendezvous.rank,
                    world: rendezvous.world_size,
                    message: format!("starting a thread to join the group: {e}"),
                })?;
            let doing = format!(
                "joining the group at {}:{}",
                rendezvous.master_addr, rendezvous.master_port
            );
            let failed = |message: String| DistError::Failed {
                rank: rendezvous.rank,
                world: rendezvous.world_size,
                message: format!("{doing}: {message}"),
            };
            let raw = match receiver.recv_timeout(timeout + join_margin(timeout)) {
                Ok(Ok(raw)) => raw as *mut std::ffi::c_void,
                Ok(Err(message)) => return Err(failed(message)),
                Err(_) => {
                    return Err(failed(format!(
                        "no answer within {:.0?}: the port may be held by a program that is \
                         not the group's store",
                        timeout + join_margin(timeout)
                    )))
                }
            };
            let group = ProcessGroup {
                raw,
                rank: rendezvous.rank,
                world_size: rendezvous.world_size,
                backend,
            };
            Ok(group)
        }
        #[cfg(not(ooze_dist))]
        {
            let _ = (rendezvous, backend, timeout, prefix);
            Err(DistError::Unavailable)
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    #[cfg(ooze_dist)]
    fn error(&self, doing: &str) -> DistError {
        DistError::Failed {
            rank: self.rank,
            world: self.world_size,
            message: format!("{doing}: {}", last_error()),
        }
    }

    #[cfg(ooze_dist)]
    fn check(&self, code: i32, doing: &str) -> Result<(), DistError> {
        if code == 0 {
            Ok(())
        } else {
            Err(self.error(doing))
        }
    }

    /// In place on every rank: `op` over the ranks' tensors (same shape and dtype everywhere;
    /// contiguous).
    pub fn all_reduce(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<(), DistError> {
        #[cfg(ooze_dist)]
        {
            // SAFETY: a live tensor; c10d writes its storage in place.
            let code = unsafe {
                ffi::ooze_dist_all_reduce(self.raw, tensor.as_mut_ptr().cast(), op as i32)
            };
            self.check(code, "all-reduce")
        }
        #[cfg(not(ooze_dist))]
        {
            let _ = (tensor, op);
            Err(DistError::Unavailable)
        }
    }

    /// In place: every rank's tensor becomes rank `root`'s.
    pub fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), DistError> {
        #[cfg(ooze_dist)]
        {
            // SAFETY: as in all_reduce.
            let code = unsafe {
                ffi::ooze_dist_broadcast(self.raw, tensor.as_mut_ptr().cast(), root as i32)
            };
            self.check(code, "broadcast")
        }
        #[cfg(not(ooze_dist))]
        {
            let _ = (tensor, root);
            Err(DistError::Unavailable)
        }
    }

    /// `out` (world size × `input`'s elements, contiguous) ← every rank's `input`, in rank order.
    pub fn all_gather_into(&self, out: &mut Tensor, input: &Tensor) -> Result<(), DistError> {
        #[cfg(ooze_dist)]
        {
            // SAFETY: live tensors; c10d only reads `input`.
            let code = unsafe {
                ffi::ooze_dist_all_gather(
                    self.raw,
                    out.as_mut_ptr().cast(),
                    input.as_ptr() as *mut _,
                )
            };
            self.check(code, "all-gather")
        }
        #[cfg(not(ooze_dist))]
        {
            let _ = (out, input);
            Err(DistError::Unavailable)
        }
    }

    /// `out` ← this rank's slice (in rank order) of `op` over the ranks' `input` (world size ×
    /// `out`'s elements).
    pub fn reduce_scatter_into(
        &self,
        out: &mut Tensor,
        input: &Tensor,
        op: ReduceOp,
    ) -> Result<(), DistError> {
        #[cfg(ooze_dist)]
        {
            // SAFETY: as in all_gather_into (c10d may use `input` as scratch space).
            let code = unsafe {
                ffi::ooze_dist_reduce_scatter(
                    self.raw,
                    out.as_mut_ptr().cast(),
                    input.as_ptr() as *mut _,
                    op as i32,
                )
            };
            self.check(code, "reduce-scatter")
        }
        #[cfg(not(ooze_dist))]
        {
            let _ = (out, input, op);
            Err(DistError::Unavailable)
        }
    }

    /// Starts `out` ← every rank's `input` (as [`ProcessGroup::all_gather_into`]) and returns at
    /// once; [`Pending::wait`] finishes it. The tensors stay alive in the handle until then.
    pub fn start_all_gather(&self, out: Tensor, input: Tensor) -> Result<Pending<'_>, DistError> {
        #[cfg(ooze_dist)]
        {
            // SAFETY: live tensors, kept alive by the handle until the wait.
            let work = unsafe {
                ffi::ooze_dist_all_gather_start(
                    self.raw,
                    out.as_ptr() as *mut _,
                    input.as_ptr() as *mut _,
                )
            };
            self.started(work, "all-gather", [out, input])
        }
        #[cfg(not(ooze_dist))]
        {
            let _ = (out, input);
            Err(DistError::Unavailable)
        }
    }

    /// Starts `out` ← this rank's slice of the sum over ranks of `input` (as
    /// [`ProcessGroup::reduce_scatter_into`]) and returns at once.
    pub fn start_reduce_scatter(
        &self,
        out: Tensor,
        input: Tensor,
    ) -> Result<Pending<'_>, DistError> {
        #[cfg(ooze_dist)]
        {
            // SAFETY: as in start_all_gather.
            let work = unsafe {
                ffi::ooze_dist_reduce_scatter_start(
                    self.raw,
                    out.as_ptr() as *mut _,
                    input.as_ptr() as *mut _,
                    ReduceOp::Sum as i32,
                )
            };
            self.started(work, "reduce-scatter", [out, input])
        }
        #[cfg(not(ooze_dist))]
        {
            let _ = (out, input);
            Err(DistError::Unavailable)
        }
    }

    #[cfg(ooze_dist)]
    fn started(
        &self,
        work: *mut std::ffi::c_void,
        doing: &'static str,
        [out, input]: [Tensor; 2],
    ) -> Result<Pending<'_>, DistError> {
        if work.is_null() {
            return Err(self.error(doing));
        }
        Ok(Pending {
            group: self,
            work,
            doing,
            out: Some(out),
            _input: input,
        })
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<(), DistError> {
        #[cfg(ooze_dist)]
        {
            // SAFETY: a live group.
            let code = unsafe { ffi::ooze_dist_barrier(self.raw) };
            self.check(code, "barrier")
        }
        #[cfg(not(ooze_dist))]
        Err(DistError::Unavailable)
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        #[cfg(ooze_dist)]
        if !self.raw.is_null() {
            // SAFETY: created by ooze_dist_new and freed once.
            unsafe { ffi::ooze_dist_free(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<Option<Rendezvous>, DistError> {
        let vars: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Rendezvous::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn reads_the_launcher_contract_and_names_a_bad_variable() {
        assert_eq!(from(&[]).unwrap(), None);
        assert_eq!(from(&[("WORLD_SIZE", "")]).unwrap(), None);
        let r = from(&[("WORLD_SIZE", "2"), ("RANK", "1")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                r.rank,
                r.world_size,
                r.local_rank,
                r.master_port,
                r.agent_store
            ),
            (1, 2, 1, 29500, false)
        );
        assert_eq!(r.master_addr, "127.0.0.1");
        let r = from(&[
            ("WORLD_SIZE", "4"),
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "1234"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.local_rank, r.master_port, r.agent_store),
            (1, 1234, true)
        );
        assert_eq!(r.master_addr, "node0");
        for (pairs, named) in [
            (
                &[("WORLD_SIZE", "two"), ("RANK", "0")][..],
                "WORLD_SIZE=\"two\"",
            ),
            (
                &[("WORLD_SIZE", "0"), ("RANK", "0")][..],
                "WORLD_SIZE=\"0\"",
            ),
            (
                &[("WORLD_SIZE", "2")][..],
                "RANK=\"\": set beside WORLD_SIZE=2",
            ),
            (
                &[("WORLD_SIZE", "2"), ("RANK", "2")][..],
                "RANK=\"2\": a rank from 0 to 1",
            ),
            (
                &[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "70000")][..],
                "MASTER_PORT=\"70000\"",
            ),
        ] {
            let e = from(pairs).unwrap_err().to_string();
            assert!(e.contains(named), "{e:?} names {named:?}");
        }
    }
}

#[cfg(all(test, ooze_dist))]
mod collective_tests {
    use super::*;
    use crate::tch::{Device, Kind};

    /// Rank `rank` of `world_size`, as a thread of this process, rendezvousing on `port`.
    fn local_rank(rank: usize, world_size: usize, port: u16) -> Rendezvous {
        Rendezvous {
            rank,
            world_size,
            local_rank: rank,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            agent_store: false,
        }
    }

    /// Two ranks as two threads of this process, on Gloo.
    #[test]
    fn two_gloo_ranks_reduce_broadcast_gather_and_scatter() {
        let port = free_port("127.0.0.1").unwrap();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let rendezvous = local_rank(rank, 2, port);
                    let g =
                        ProcessGroup::connect(&rendezvous, Backend::Gloo, Duration::from_secs(60))
                            .unwrap();
                    let opts = (Kind::Double, Device::Cpu);
                    let r = rank as f64;
                    let mut t = Tensor::from_slice(&[1.0 + r, 10.0 * r]).to_kind(Kind::Double);
                    g.all_reduce(&mut t, ReduceOp::Sum).unwrap();
                    let sum = Vec::<f64>::try_from(&t).unwrap();
                    let mut m = Tensor::from_slice(&[r, -r]);
                    g.all_reduce(&mut m, ReduceOp::Max).unwrap();
                    let max = Vec::<f64>::try_from(&m).unwrap();
                    let mut b = Tensor::full([3], 7.0 + r, opts);
                    g.broadcast(&mut b, 1).unwrap();
                    let broadcast = Vec::<f64>::try_from(&b).unwrap();
                    let mut all = Tensor::zeros([4], opts);
                    g.all_gather_into(&mut all, &Tensor::full([2], r, opts))
                        .unwrap();
                    let gathered = Vec::<f64>::try_from(&all).unwrap();
                    let mut mine = Tensor::zeros([2], opts);
                    let input =
                        Tensor::from_slice(&[1.0, 2.0, 3.0, 4.0]).to_kind(Kind::Double) * (1.0 + r);
                    g.reduce_scatter_into(&mut mine, &input, ReduceOp::Sum)
                        .unwrap();
                    let scattered = Vec::<f64>::try_from(&mine).unwrap();
                    g.barrier().unwrap();
                    (sum, max, broadcast, gathered, scattered)
                })
            })
            .collect();
        let results: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        for (rank, (sum, max, broadcast, gathered, scattered)) in results.into_iter().enumerate() {
            assert_eq!(sum, vec![3.0, 10.0]);
            assert_eq!(max, vec![1.0, 0.0]);
            assert_eq!(broadcast, vec![8.0; 3]);
            assert_eq!(gathered, vec![0.0, 0.0, 1.0, 1.0]);
            let expected = if rank == 0 {
                vec![3.0, 6.0]
            } else {
                vec![9.0, 12.0]
            };
            assert_eq!(scattered, expected);
        }
    }

    /// Three ranks with several started collectives in flight at once (prefetched gathers and
    /// background reduce-scatters, as sharded training keeps them), finished out of order.
    #[test]
    fn three_gloo_ranks_finish_started_collectives() {
        let port = free_port("127.0.0.1").unwrap();
        let ranks: Vec<_> = (0..3)
            .map(|rank| {
                std::thread::spawn(move || {
                    let rendezvous = local_rank(rank, 3, port);
                    let g =
                        ProcessGroup::connect(&rendezvous, Backend::Gloo, Duration::from_secs(60))
                            .unwrap();
                    let opts = (Kind::Double, Device::Cpu);
                    let r = rank as f64;
                    let mut out = Vec::new();
                    for round in 0..4 {
                        let k = round as f64;
                        let gather = g
                            .start_all_gather(
                                Tensor::zeros([6], opts),
                                Tensor::from_slice(&[r + 10.0 * k, -r]),
                            )
                            .unwrap();
                        let input = Tensor::arange(9, opts) * (1.0 + r) + k;
                        let scatter = g
                            .start_reduce_scatter(Tensor::zeros([3], opts), input)
                            .unwrap();
                        let scattered = Vec::<f64>::try_from(&scatter.wait().unwrap()).unwrap();
                        let gathered = Vec::<f64>::try_from(&gather.wait().unwrap()).unwrap();
                        out.push((gathered, scattered));
                    }
                    out
                })
            })
            .collect();
        let results: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        for (rank, rounds) in results.into_iter().enumerate() {
            for (round, (gathered, scattered)) in rounds.into_iter().enumerate() {
                let k = round as f64;
                assert_eq!(
                    gathered,
                    vec![10.0 * k, 0.0, 1.0 + 10.0 * k, -1.0, 2.0 + 10.0 * k, -2.0]
                );
                // Sum over ranks r of (i·(1 + r) + k) = 6i + 3k at i = 3·rank + j.
                let expected: Vec<f64> = (0..3)
                    .map(|j| 6.0 * (3 * rank + j) as f64 + 3.0 * k)
                    .collect();
                assert_eq!(scattered, expected, "rank {rank} round {round}");
            }
        }
    }

    /// Several groups of one process (two ranks each, as threads) start their first collectives
    /// at the same instant, as the data-parallel tests' ranks do: c10d's flight recorder, shared
    /// by every Gloo group of the process, must not see them at once (it crashed the process).
    #[test]
    fn gloo_groups_of_one_process_start_collectives_at_once() {
        let groups = 8;
        for _ in 0..4 {
            // Distinct ports outside the ephemeral range, which the groups' own Gloo listeners
            // take theirs from (free_port).
            let ports: Vec<u16> = (0..groups)
                .map(|_| free_port("127.0.0.1").unwrap())
                .collect();
            let start = std::sync::Arc::new(std::sync::Barrier::new(2 * groups));
            let ranks: Vec<_> = ports
                .into_iter()
                .flat_map(|port| (0..2).map(move |rank| (port, rank)))
                .map(|(port, rank)| {
                    let start = start.clone();
                    std::thread::spawn(move || {
                        let rendezvous = local_rank(rank, 2, port);
                        let g = ProcessGroup::connect(
                            &rendezvous,
                            Backend::Gloo,
                            Duration::from_secs(60),
                        );
                        // Every thread reaches the barrier, also one whose group failed.
                        start.wait();
                        let g = g.unwrap();
                        let mut t = Tensor::full([2], rank as f64, (Kind::Double, Device::Cpu));
                        for _ in 0..10 {
                            g.all_reduce(&mut t, ReduceOp::Max).unwrap();
                        }
                        Vec::<f64>::try_from(&t).unwrap()
                    })
                })
                .collect();
            for r in ranks {
                assert_eq!(r.join().unwrap(), vec![1.0, 1.0]);
            }
        }
    }

    /// A store client that reaches a program which accepts connections but never answers (as a
    /// Gloo listener that took the store's port does) stops with an error, not a hang.
    #[test]
    fn a_port_held_by_something_else_is_an_error_not_a_hang() {
        let silent = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = silent.local_addr().unwrap().port();
        let held = std::thread::spawn(move || {
            let connections: Vec<_> = silent.incoming().take(1).collect();
            std::thread::sleep(Duration::from_secs(30));
            drop(connections);
        });
        let rendezvous = local_rank(1, 2, port);
        let e = ProcessGroup::connect(&rendezvous, Backend::Gloo, Duration::from_secs(2))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "rank 1 of 2: joining the group at 127.0.0.1:{port}: "
            )),
            "{e}"
        );
        drop(held);
    }

    /// A rank whose peer never comes stops with an error naming it, not a hang or an abort.
    #[test]
    fn a_missing_peer_is_an_error_after_the_timeout() {
        let rendezvous = local_rank(0, 2, free_port("127.0.0.1").unwrap());
        let e = ProcessGroup::connect(&rendezvous, Backend::Gloo, Duration::from_secs(2))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("rank 0 of 2: joining the group at 127.0.0.1:"),
            "{e}"
        );
    }
}

/// A collective in flight ([`ProcessGroup::start_all_gather`], [`ProcessGroup::start_reduce_scatter`]).
/// Dropping it without [`Pending::wait`] waits for it all the same (its tensors must outlive it).
pub struct Pending<'g> {
    group: &'g ProcessGroup,
    #[cfg_attr(not(ooze_dist), allow(dead_code))]
    work: *mut std::ffi::c_void,
    #[cfg_attr(not(ooze_dist), allow(dead_code))]
    doing: &'static str,
    out: Option<Tensor>,
    _input: Tensor,
}

impl Pending<'_> {
    /// Finishes the collective and returns its output. On GPUs the current stream waits for it
    /// (the host does not); on CPUs the host waits.
    pub fn wait(mut self) -> Result<Tensor, DistError> {
        let out = self.out.take().expect("invariant: waited once");
        self.finish()?;
        Ok(out)
    }

    fn finish(&mut self) -> Result<(), DistError> {
        if self.work.is_null() {
            return Ok(());
        }
        let work = std::mem::replace(&mut self.work, std::ptr::null_mut());
        #[cfg(ooze_dist)]
        {
            // SAFETY: a handle from a start call, waited for and freed exactly once.
            let code = unsafe { ffi::ooze_dist_wait(self.group.raw, work) };
            self.group.check(code, self.doing)
        }
        #[cfg(not(ooze_dist))]
        {
            let _ = (work, self.group);
            Ok(())
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        // The tensors are freed right after; the collective must be done with them first.
        let _ = self.finish();
    }
}
