//! The policy's passes when its parameters are sharded ([`crate::sharding`]): the forward passes
//! of [`crate::forward`], run one unit at a time with each unit gathered just before its use and
//! released after. Training always recomputes activations: a block's full weights exist only
//! while that block runs, forward and again in the backward pass.
//!
//! Every rank must issue the same collectives in the same order, so a rank with fewer
//! micro-batches than another runs the same passes without samples ([`idle_scoring`],
//! [`idle_training`]).

use crate::forward::{head_options, pack_tokens, EntropyUse, Packed, Recomputed, ResponseScores};
use crate::sharding::{Pass, ShardedModel};
use crate::TrainError;
use ooze_core::Sample;
use ooze_model::scoring::head_log_probs;
use ooze_model::{Attention, Decoder};
use ooze_torch::tch::{self, Tensor};

/// Log-probs of the response tokens of `samples` without gradients (the scoring passes).
pub(crate) fn score(
    decoder: &Decoder,
    model: &ShardedModel,
    samples: &[Sample],
    temperature: f64,
    entropy: EntropyUse,
) -> Result<Tensor, TrainError> {
    score_with(decoder, model, samples, |hidden, p| {
        let options = head_options(temperature, entropy, false);
        head_log_probs(decoder, hidden, &p.targets, &options).0
    })
}

/// What `head` makes of the final hidden states at the response positions of `samples`, without
/// gradients, the units gathered one at a time (the head unit while `head` runs).
pub(crate) fn score_with(
    decoder: &Decoder,
    model: &ShardedModel,
    samples: &[Sample],
    head: impl FnOnce(&Tensor, &Packed) -> Tensor,
) -> Result<Tensor, TrainError> {
    let _guard = tch::no_grad_guard();
    let mut pass = model.pass(model.scoring_order());
    let p = pack_tokens(decoder, samples);
    let attention = || Attention::Packed {
        lengths: &p.lengths,
    };
    pass.gather(0)?;
    let mut x = decoder.embed(&p.ids);
    if !model.tied() {
        pass.release(0);
    }
    for i in 0..decoder.num_layers() {
        pass.gather(i + 1)?;
        x = decoder.run_layers(x, i..i + 1, &p.positions, attention());
        pass.release(i + 1);
    }
    let head_unit = model.head_unit();
    pass.gather(head_unit)?;
    let hidden = decoder
        .final_norm(&x)
        .view([-1, decoder.config.hidden_size])
        .index_select(0, &p.select);
    let scores = head(&hidden, &p);
    pass.release(head_unit);
    if model.tied() {
        pass.release(0);
    }
    pass.finish()?;
    Ok(scores)
}

/// [`score`]'s collectives without samples.
pub(crate) fn idle_scoring(model: &ShardedModel) -> Result<(), TrainError> {
    let mut pass = model.pass(model.scoring_order());
    pass.gather(0)?;
    if !model.tied() {
        pass.release(0);
    }
    for u in 1..model.head_unit() {
        pass.gather(u)?;
        pass.release(u);
    }
    pass.gather(model.head_unit())?;
    pass.release(model.head_unit());
    if model.tied() {
        pass.release(0);
    }
    pass.finish()
}

/// The training forward of a micro-batch (as [`crate::forward::response_log_probs_recomputed`]):
/// the blocks run without gradients, keeping their inputs; the head unit (and, tied, the
/// embeddings) stays gathered for the loss's backward pass. Then call [`backward`].
pub(crate) fn forward(
    decoder: &Decoder,
    model: &ShardedModel,
    pass: &mut Pass<'_>,
    samples: &[Sample],
    temperature: f64,
    entropy: EntropyUse,
) -> Result<(ResponseScores, Recomputed), TrainError> {
    forward_with(decoder, model, pass, samples, |hidden, packed| {
        let options = head_options(temperature, entropy, true);
        let (log_probs, entropy) = head_log_probs(decoder, hidden, &packed.targets, &options);
        ResponseScores { log_probs, entropy }
    })
}

/// [`forward`] with any `head` over the final hidden states at the response positions (which
/// carry gradients back to the last block): the policy's log-probs, a critic's values.
pub(crate) fn forward_with<T>(
    decoder: &Decoder,
    model: &ShardedModel,
    pass: &mut Pass<'_>,
    samples: &[Sample],
    head: impl FnOnce(&Tensor, &Packed) -> T,
) -> Result<(T, Recomputed), TrainError> {
    let packed = pack_tokens(decoder, samples);
    let mut inputs = Vec::with_capacity(decoder.num_layers());
    let last = {
        let _guard = tch::no_grad_guard();
        pass.gather(0)?;
        let mut x = decoder.embed(&packed.ids);
        if !model.tied() {
            pass.release(0);
        }
        for i in 0..decoder.num_layers() {
            pass.gather(i + 1)?;
            // A copy: without autograd the blocks add their residuals into `x` in place.
            inputs.push(x.copy());
            x = decoder.run_layers(
                x,
                i..i + 1,
                &packed.positions,
                Attention::Packed {
                    lengths: &packed.lengths,
                },
            );
            pass.release(i + 1);
        }
        x
    };
    pass.gather(model.head_unit())?;
    let last = last.detach().set_requires_grad(true);
    let hidden = decoder
        .final_norm(&last)
        .view([-1, decoder.config.hidden_size])
        .index_select(0, &packed.select);
    let out = head(&hidden, &packed);
    Ok((
        out,
        Recomputed {
            packed,
            inputs,
            last,
        },
    ))
}

/// After the loss's backward pass: the head's gradients go to their shards, then every block is
/// gathered again, recomputed with gradients and backpropagated in reverse, its gradients
/// reduce-scattered as soon as it is done; last the embeddings.
pub(crate) fn backward(
    recomputed: Recomputed,
    decoder: &Decoder,
    model: &ShardedModel,
    pass: &mut Pass<'_>,
) -> Result<(), TrainError> {
    let head = model.head_unit();
    pass.scatter_gradients(head)?;
    pass.release(head);
    let mut grad = recomputed.last.grad();
    assert!(
        grad.defined(),
        "invariant: the loss's backward pass reached the last block"
    );
    let packed = &recomputed.packed;
    for (i, input) in recomputed.inputs.iter().enumerate().rev() {
        pass.gather(i + 1)?;
        let x = input.detach().set_requires_grad(true);
        let y = decoder.run_layers(
            x.shallow_clone(),
            i..i + 1,
            &packed.positions,
            Attention::Packed {
                lengths: &packed.lengths,
            },
        );
        (y * &grad).sum(grad.kind()).backward();
        grad = x.grad();
        pass.scatter_gradients(i + 1)?;
        pass.release(i + 1);
    }
    if !model.tied() {
        pass.gather(0)?;
    }
    let embedded = decoder.embed(&packed.ids);
    (embedded * &grad).sum(grad.kind()).backward();
    pass.scatter_gradients(0)?;
    pass.release(0);
    Ok(())
}

/// A training micro-batch's collectives ([`forward`], then [`backward`]) without samples: the
/// gradients this rank adds are zeros.
pub(crate) fn idle_training(model: &ShardedModel) -> Result<(), TrainError> {
    let mut pass = model.pass(model.training_order());
    idle_forward(model, &mut pass)?;
    idle_backward(model, &mut pass)?;
    pass.finish()
}

/// [`forward`]'s collectives without samples (the head unit stays gathered).
pub(crate) fn idle_forward(model: &ShardedModel, pass: &mut Pass<'_>) -> Result<(), TrainError> {
    let head = model.head_unit();
    pass.gather(0)?;
    if !model.tied() {
        pass.release(0);
    }
    for u in 1..head {
        pass.gather(u)?;
        pass.release(u);
    }
    pass.gather(head)
}

/// [`backward`]'s collectives without samples: zero gradients scattered.
pub(crate) fn idle_backward(model: &ShardedModel, pass: &mut Pass<'_>) -> Result<(), TrainError> {
    let head = model.head_unit();
    pass.scatter_gradients(head)?;
    pass.release(head);
    for u in (1..head).rev() {
        pass.gather(u)?;
        pass.scatter_gradients(u)?;
        pass.release(u);
    }
    if !model.tied() {
        pass.gather(0)?;
    }
    pass.scatter_gradients(0)?;
    pass.release(0);
    Ok(())
}
