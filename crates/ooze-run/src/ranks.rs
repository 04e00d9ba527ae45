//! A run on several ranks (plain data parallelism, colocated): every rank holds the policy, its
//! own engine on its own device and a replica of the trainer. Each rollout's prompts are dealt
//! round-robin from the one prompt order (rank `r` takes draws `r, r + N, …`, keeping their
//! global group numbers, so sampling seeds are the one-process run's); each rank generates and
//! scores its groups; the ranks exchange them, and every rank trains on the whole rollout,
//! running its share of every step ([`ooze_train::data_parallel`]). Rank 0 alone evaluates,
//! writes the run directory and prints.

use anyhow::Context;
use ooze_rollout::manager::Batch;
use ooze_torch::dist::{ProcessGroup, ReduceOp};
use ooze_torch::tch::{Device, Kind, Tensor};
use std::sync::Arc;

/// This process's place among the run's ranks.
#[derive(Debug, Clone)]
pub struct RunRanks {
    pub group: Arc<ProcessGroup>,
    /// Where this rank computes (its GPU, or the CPU); the collectives' tensors live there too.
    pub device: Device,
}

impl RunRanks {
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }

    /// The largest of every rank's `value`.
    pub(crate) fn max(&self, value: u64) -> anyhow::Result<u64> {
        let mut t = Tensor::from_slice(&[value as i64]).to_device(self.device);
        self.group
            .all_reduce(&mut t, ReduceOp::Max)
            .context("the ranks' prompt draws")?;
        Ok(t.int64_value(&[0]) as u64)
    }

    /// Every rank's `bytes`, in rank order.
    fn all_gather_bytes(&self, bytes: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
        let (rank, world) = (self.rank(), self.world_size());
        let device = self.device;
        let mut lengths = vec![0i64; world];
        lengths[rank] = bytes.len() as i64;
        let mut lengths_t = Tensor::from_slice(&lengths).to_device(device);
        self.group
            .all_reduce(&mut lengths_t, ReduceOp::Sum)
            .context("exchanging the rollout's sizes")?;
        let lengths = Vec::<i64>::try_from(lengths_t.to_device(Device::Cpu))
            .expect("invariant: a 1-D int64 tensor converts");
        let longest = lengths.iter().copied().max().unwrap_or(0).max(1);
        let mut mine = bytes.to_vec();
        mine.resize(longest as usize, 0);
        let input = Tensor::from_slice(&mine).to_device(device);
        let mut all = Tensor::zeros([longest * world as i64], (Kind::Uint8, device));
        self.group
            .all_gather_into(&mut all, &input)
            .context("exchanging the rollout's groups")?;
        let all = Vec::<u8>::try_from(all.to_device(Device::Cpu))
            .expect("invariant: a 1-D uint8 tensor converts");
        Ok(lengths
            .iter()
            .enumerate()
            .map(|(r, &n)| {
                let start = r * longest as usize;
                all[start..start + n as usize].to_vec()
            })
            .collect())
    }

    /// The whole rollout from every rank's part: groups in draw order, counts summed, the
    /// rounds' maximum, and rank 0's activity series (each rank's executions are its own).
    pub(crate) fn exchange(&self, part: Batch) -> anyhow::Result<Batch> {
        let bytes = serde_json::to_vec(&part).context("serialising this rank's rollout")?;
        let parts = self.all_gather_bytes(&bytes)?;
        let mut whole = Batch::default();
        let mut own = Some(part);
        for (r, p) in parts.iter().enumerate() {
            let p: Batch = if r == self.rank() {
                own.take().expect("invariant: one part is this rank's")
            } else {
                serde_json::from_slice(p).with_context(|| format!("reading rank {r}'s rollout"))?
            };
            whole.generated_groups += p.generated_groups;
            whole.rounds = whole.rounds.max(p.rounds);
            for (reason, n) in p.dropped {
                *whole.dropped.entry(reason).or_default() += n;
            }
            if r == 0 {
                whole.activity = p.activity;
            }
            whole.groups.extend(p.groups);
        }
        // In draw order, as one process has them: optimizer steps take consecutive groups.
        whole.groups.sort_by_key(|g| g.group);
        Ok(whole)
    }
}
