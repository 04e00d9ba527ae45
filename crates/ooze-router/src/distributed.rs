//! Weights to the engines over a process group (SGLang's `init_weights_update_group` and
//! `update_weights_from_distributed`): this process is rank 0 and serves the group's store; each
//! engine in it is one more rank. Every update names the tensors to each engine, then broadcasts
//! them from rank 0 in that order (NCCL between GPUs, Gloo between CPUs). The group is formed
//! again whenever its members change: an engine that failed an update leaves it, and engines
//! that came back or joined since enter it at the next update, before their first request.

use crate::{short, Engine, Shared};
use ooze_engine::WeightSource;
use ooze_torch::dist::{Backend, ProcessGroup, Rendezvous};
use ooze_torch::tch::{Kind, Tensor};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long forming the group may wait for the engines.
const JOIN_TIMEOUT: Duration = Duration::from_secs(120);

/// The group the engines are in now.
pub(crate) struct WeightGroup {
    name: String,
    members: Vec<String>,
    group: ProcessGroup,
}

fn dtype(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        _ => "float32",
    }
}

/// Forms a group of this process and `members`; engines that cannot join are marked down.
fn form(shared: &Shared, members: &[Arc<Engine>], serial: u64) -> Result<WeightGroup, String> {
    let (host, backend) = (&shared.config.trainer_address, shared.config.weight_backend);
    let port = ooze_torch::dist::free_port(host)
        .map_err(|e| format!("finding a free port on {host} for the weight group: {e}"))?;
    let name = format!("ooze-weights-{serial}");
    let world = members.len() + 1;
    let backend_name = match backend {
        Backend::Nccl => "nccl",
        Backend::Gloo => "gloo",
    };
    let (group, joined) = std::thread::scope(|s| {
        let joins: Vec<_> = members
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let body = json!({
                    "master_address": host, "master_port": port, "rank_offset": i + 1,
                    "world_size": world, "group_name": name, "backend": backend_name,
                });
                let url = format!("{}/init_weights_update_group", e.url);
                s.spawn(move || shared.generate.post(&url, None, &body))
            })
            .collect();
        let rendezvous = Rendezvous {
            rank: 0,
            world_size: world,
            local_rank: 0,
            master_addr: host.clone(),
            master_port: port,
            agent_store: false,
        };
        let group = ProcessGroup::connect_with_prefix(
            &rendezvous,
            backend,
            JOIN_TIMEOUT,
            &format!("{name}/"),
        );
        let joined: Vec<_> = joins.into_iter().map(|j| j.join()).collect();
        (group, joined)
    });
    let mut failed = false;
    for (e, j) in members.iter().zip(joined) {
        match j {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => {
                shared.mark_down(e, &format!("joining the weight group: {}", short(&err)));
                failed = true;
            }
            Err(_) => failed = true,
        }
    }
    let group = group.map_err(|e| format!("forming the weight group: {e}"))?;
    if failed {
        return Err("an engine could not join the weight group".into());
    }
    Ok(WeightGroup {
        name,
        members: members.iter().map(|e| e.url.clone()).collect(),
        group,
    })
}

/// Broadcasts `tensors` (HF names) to every engine that answers; returns the new version once at
/// least one engine has it.
pub(crate) fn update(shared: &Arc<Shared>, source: WeightSource) -> Result<u64, String> {
    let WeightSource::Tensors(tensors) = source else {
        return Err("rollout.weight_sync over a process group takes the trainer's tensors".into());
    };
    let version = shared.weights.lock().expect("weights lock").1 + 1;
    // Every engine that answers now: those in the rotation and those waiting for weights.
    let members: Vec<Arc<Engine>> = shared
        .engines
        .lock()
        .expect("engines lock")
        .iter()
        .filter(|e| {
            e.healthy.load(Ordering::SeqCst)
                || shared
                    .control
                    .get(&format!("{}/health", e.url), None)
                    .is_ok()
        })
        .cloned()
        .collect();
    if members.is_empty() {
        return Err("no engine answers to take the new weights".into());
    }
    let urls: Vec<String> = members.iter().map(|e| e.url.clone()).collect();
    let mut slot = shared.weight_group.lock().expect("weight group lock");
    if slot.as_ref().is_none_or(|g| g.members != urls) {
        if let Some(old) = slot.take() {
            for url in &old.members {
                let _ = shared.control.post(
                    &format!("{url}/destroy_weights_update_group"),
                    None,
                    &json!({"group_name": old.name}),
                );
            }
        }
        let serial = shared.group_serial.fetch_add(1, Ordering::SeqCst);
        *slot = Some(form(shared, &members, serial)?);
    }
    let group = slot.as_ref().expect("formed");
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    let dtypes: Vec<&str> = tensors.iter().map(|(_, t)| dtype(t.kind())).collect();
    let shapes: Vec<Vec<i64>> = tensors.iter().map(|(_, t)| t.size()).collect();
    let body =
        json!({"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group.name});
    let (sent, answers) = std::thread::scope(|s| {
        let posts: Vec<_> = members
            .iter()
            .map(|e| {
                let url = format!("{}/update_weights_from_distributed", e.url);
                let body = &body;
                s.spawn(move || shared.generate.post(&url, None, body))
            })
            .collect();
        let mut sent = Ok(());
        for (name, t) in &tensors {
            let mut t: Tensor = t.contiguous();
            if let Err(e) = group.group.broadcast(&mut t, 0) {
                sent = Err(format!("broadcasting {name}: {e}"));
                break;
            }
        }
        let answers: Vec<_> = posts.into_iter().map(|p| p.join()).collect();
        (sent, answers)
    });
    let mut loaded = 0;
    for (e, answer) in members.iter().zip(answers) {
        match answer {
            Ok(Ok(_)) if sent.is_ok() => {
                e.version.store(version, Ordering::SeqCst);
                if !e.healthy.swap(true, Ordering::SeqCst) {
                    eprintln!(
                        "router: engine {} is in the rotation (weights v{version})",
                        e.url
                    );
                }
                loaded += 1;
            }
            Ok(Err(err)) => shared.mark_down(e, &format!("receiving new weights: {}", short(&err))),
            _ => shared.mark_down(e, "receiving new weights"),
        }
    }
    if loaded < members.len() || sent.is_err() {
        // Someone left mid-update: the next update forms the group again without it.
        *slot = None;
    }
    shared.weights.lock().expect("weights lock").1 = version;
    shared.updated.store(true, Ordering::SeqCst);
    sent?;
    if loaded == 0 {
        return Err("no engine took the new weights".into());
    }
    Ok(version)
}
