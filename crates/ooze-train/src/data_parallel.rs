//! Plain data parallelism: every rank holds the whole model and optimizer state and the whole
//! step's samples; each rank runs the micro-batches of its share of the samples (contiguous spans
//! balanced by tokens), and the ranks sum their gradients before the identical optimizer steps.
//! Because every token's loss weight is computed for the whole step first (`ooze_algo::
//! token_weights`), the summed gradients and the summed loss terms are the one-process step's,
//! up to the order of the floating-point additions.

use crate::batch::pack;
use crate::TrainError;
use ooze_core::Sample;
use ooze_torch::dist::{ProcessGroup, ReduceOp};
use ooze_torch::tch::{Device, Kind, Tensor};
use std::ops::Range;

pub(crate) fn dist_error(e: ooze_torch::dist::DistError) -> TrainError {
    TrainError::Dist(e.to_string())
}

/// The samples rank `rank` of `world` trains on: `world` contiguous spans with about equal
/// token counts (a span may be empty when there are fewer samples than ranks).
pub fn span(samples: &[Sample], rank: usize, world: usize) -> Range<usize> {
    let total: usize = samples.iter().map(|s| s.tokens.len()).sum();
    // A sample goes to the rank in whose share of the tokens its middle falls; the owners rise
    // with the index, so each rank's samples are contiguous.
    let mut before = 0;
    let owners: Vec<usize> = samples
        .iter()
        .map(|s| {
            let middle = 2 * before + s.tokens.len();
            before += s.tokens.len();
            (middle * world / (2 * total).max(1)).min(world - 1)
        })
        .collect();
    let start = owners.partition_point(|&o| o < rank);
    let end = owners.partition_point(|&o| o <= rank);
    start..end
}

/// The micro-batches (ranges into `samples`) this rank runs: its span packed to `max_tokens`.
pub(crate) fn micro_batches(
    samples: &[Sample],
    max_tokens: usize,
    group: Option<&ProcessGroup>,
) -> Vec<Range<usize>> {
    let Some(g) = group else {
        return pack(samples, max_tokens);
    };
    let own = span(samples, g.rank(), g.world_size());
    pack(&samples[own.clone()], max_tokens)
        .into_iter()
        .map(|r| r.start + own.start..r.end + own.start)
        .collect()
}

/// The most micro-batches any rank has (sharded passes need every rank in each one).
pub(crate) fn most_micro_batches(
    group: &ProcessGroup,
    own: usize,
    device: Device,
) -> Result<usize, TrainError> {
    Ok(sum_over_ranks(group, &[own as f64], ReduceOp::Max, device)?[0] as usize)
}

/// Sums `values` over the ranks (f64, on `device`: Gloo takes CPU tensors, NCCL CUDA ones).
pub(crate) fn sum_over_ranks(
    group: &ProcessGroup,
    values: &[f64],
    op: ReduceOp,
    device: Device,
) -> Result<Vec<f64>, TrainError> {
    if values.is_empty() {
        return Ok(Vec::new());
    }
    let mut t = Tensor::from_slice(values).to_device(device);
    group.all_reduce(&mut t, op).map_err(dist_error)?;
    Ok(
        Vec::<f64>::try_from(t.to_kind(Kind::Double).to_device(Device::Cpu))
            .expect("invariant: a 1-D double tensor converts"),
    )
}

/// Per-sample values every rank computed for its own micro-batches (zeros elsewhere), made
/// whole on every rank: a sum over ranks of disjoint parts.
pub(crate) fn complete_per_sample(
    group: &ProcessGroup,
    samples: &[Sample],
    partial: Vec<Option<Vec<f64>>>,
    device: Device,
) -> Result<Vec<Vec<f64>>, TrainError> {
    let flat: Vec<f64> = samples
        .iter()
        .zip(&partial)
        .flat_map(|(s, p)| match p {
            Some(v) => v.clone(),
            None => vec![0.0; s.response_length],
        })
        .collect();
    let whole = sum_over_ranks(group, &flat, ReduceOp::Sum, device)?;
    let mut out = Vec::with_capacity(samples.len());
    let mut offset = 0;
    for s in samples {
        out.push(whole[offset..offset + s.response_length].to_vec());
        offset += s.response_length;
    }
    Ok(out)
}

/// Sums every rank's gradients (fp32) into each rank's copy, in place. `grads[i]` is `None` where
/// this rank's micro-batches left tensor `i` without a gradient; after the sum it is `None` only
/// where no rank gave it one, so such tensors keep their values as in a one-process step.
/// `shapes[i]` is tensor `i`'s shape. Summed in buckets of at most `bucket` elements.
pub(crate) fn sum_gradients(
    group: &ProcessGroup,
    grads: &mut [Option<Tensor>],
    shapes: &[Vec<i64>],
    device: Device,
    bucket: i64,
) -> Result<(), TrainError> {
    let numels: Vec<i64> = shapes.iter().map(|s| s.iter().product()).collect();
    let present: Vec<f64> = grads.iter().map(|g| g.is_some() as u8 as f64).collect();
    let present = sum_over_ranks(group, &present, ReduceOp::Sum, device)?;
    let mut start = 0;
    while start < grads.len() {
        let mut end = start + 1;
        let mut size = numels[start];
        while end < grads.len() && size + numels[end] <= bucket {
            size += numels[end];
            end += 1;
        }
        let parts: Vec<Tensor> = (start..end)
            .map(|i| match &grads[i] {
                Some(g) => g.reshape([-1]),
                None => Tensor::zeros([numels[i]], (Kind::Float, device)),
            })
            .collect();
        let mut flat = Tensor::cat(&parts, 0);
        group
            .all_reduce(&mut flat, ReduceOp::Sum)
            .map_err(dist_error)?;
        let mut offset = 0;
        for i in start..end {
            let n = numels[i];
            grads[i] =
                (present[i] > 0.0).then(|| flat.narrow(0, offset, n).view(shapes[i].as_slice()));
            offset += n;
        }
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Sample {
        let mut s = Sample::with_prompt(vec![1]);
        s.push_generated(&vec![1; n - 1], &vec![-0.5; n - 1], &[])
            .unwrap();
        s
    }

    #[test]
    fn spans_cover_the_samples_in_order_balanced_by_tokens() {
        let s: Vec<_> = [10, 10, 10, 10, 30, 5, 5, 10]
            .into_iter()
            .map(sample)
            .collect();
        assert_eq!(span(&s, 0, 1), 0..8);
        assert_eq!((span(&s, 0, 2), span(&s, 1, 2)), (0..4, 4..8));
        let three: Vec<_> = (0..3).map(|r| span(&s, r, 3)).collect();
        assert_eq!(three, vec![0..3, 3..5, 5..8]);
        // Fewer samples than ranks: some spans are empty, none overlaps.
        let two: Vec<_> = [4, 4].into_iter().map(sample).collect();
        let four: Vec<_> = (0..4).map(|r| span(&two, r, 4)).collect();
        assert_eq!(four.iter().map(|r| r.len()).sum::<usize>(), 2);
        for w in four.windows(2) {
            assert!(w[0].end <= w[1].start, "{four:?}");
        }
    }
}
