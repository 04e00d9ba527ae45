//! Rotary position embeddings (RoFormer; Su et al. 2021) in the "rotate half" layout that Qwen and
//! Llama checkpoints use: the head dimension is split into two halves `(x1, x2)` and rotated as
//! `(x1·cos − x2·sin, x2·cos + x1·sin)`, with frequencies `θ^(−2i/d)`.
//!
//! Llama 3 scaling keeps high frequencies, divides low frequencies by `factor`, and interpolates
//! smoothly between the two wavelength bounds `original_max_position_embeddings / {high,low}_freq_factor`.
//! Angles are computed in fp32 and cast to the activation dtype, as transformers does.

use crate::config::{Llama3Scaling, Rope};
use ooze_torch::tch::{Device, Kind, Tensor};
use ooze_torch::transfer::upload;

/// Inverse frequencies for one head dimension, fp32 on `device`.
pub fn inverse_frequencies(rope: &Rope, head_dim: i64, device: Device) -> Tensor {
    let freqs: Vec<f32> = (0..head_dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / head_dim as f32;
            let base = 1.0 / (rope.theta as f32).powf(exponent);
            match &rope.llama3 {
                Some(scaling) => llama3_scale(base, scaling),
                None => base,
            }
        })
        .collect();
    upload(&freqs, device)
}

fn llama3_scale(inv_freq: f32, s: &Llama3Scaling) -> f32 {
    let factor = s.factor as f32;
    let low = s.low_freq_factor as f32;
    let high = s.high_freq_factor as f32;
    let old_len = s.original_max_position_embeddings as f32;
    let wavelen = 2.0 * std::f32::consts::PI / inv_freq;
    let low_freq_wavelen = old_len / low;
    let high_freq_wavelen = old_len / high;
    if wavelen > low_freq_wavelen {
        inv_freq / factor
    } else if wavelen < high_freq_wavelen {
        inv_freq
    } else {
        let smooth = (old_len / wavelen - low) / (high - low);
        (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    }
}

/// `(cos, sin)` of shape `[.., T, head_dim]` for integer `positions` of shape `[.., T]`.
///
/// The sine comes back with its first half negated, so that the rotation needs no negation:
/// `rotate_half(x)·sin = roll(x, D/2)·[−sin, sin]` (see [`apply`]).
pub fn cos_sin(inv_freq: &Tensor, positions: &Tensor, kind: Kind) -> (Tensor, Tensor) {
    let angles = positions.to_kind(Kind::Float).unsqueeze(-1) * inv_freq;
    let emb = Tensor::cat(&[&angles, &angles], -1);
    let sin = angles.sin();
    let signed_sin = Tensor::cat(&[&(-&sin), &sin], -1);
    (emb.cos().to_kind(kind), signed_sin.to_kind(kind))
}

/// The rotary tables of positions `0..len`, `[len, head_dim]` each: what [`cos_sin`] gives every
/// one of them. A decode step gathers its rows' (one kernel each) instead of computing them (about
/// ten); the bits are the same, as every operation of [`cos_sin`] is elementwise.
pub struct RopeTables {
    cos: Tensor,
    signed_sin: Tensor,
}

impl RopeTables {
    pub fn new(inv_freq: &Tensor, len: i64, kind: Kind) -> RopeTables {
        let positions = Tensor::arange(len.max(1), (Kind::Int64, inv_freq.device()));
        let (cos, signed_sin) = cos_sin(inv_freq, &positions, kind);
        RopeTables { cos, signed_sin }
    }

    /// [`cos_sin`] of `positions [B, 1]` (each below the tables' length), `[B, 1, head_dim]`.
    pub fn rows(&self, positions: &Tensor) -> (Tensor, Tensor) {
        let at = positions.view([-1]);
        (
            self.cos.index_select(0, &at).unsqueeze(1),
            self.signed_sin.index_select(0, &at).unsqueeze(1),
        )
    }
}

/// Applies the rotation to `x` of shape `[B, heads, T, head_dim]`; `cos` and the signed sine from
/// [`cos_sin`] are `[B, T, head_dim]`. Four kernels: roll, two products, a sum — and q and k can go
/// through together as one `[B, heads_q + heads_kv, T, head_dim]` tensor.
pub fn apply(x: &Tensor, cos: &Tensor, signed_sin: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let swapped = x.roll([half].as_slice(), [3i64].as_slice());
    x * cos.unsqueeze(1) + swapped * signed_sin.unsqueeze(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_bands() {
        let s = Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        // High frequency (short wavelength): unchanged.
        assert_eq!(llama3_scale(1.0, &s), 1.0);
        // Very low frequency: divided by the factor.
        let low = 2.0 * std::f32::consts::PI / 100_000.0;
        assert!((llama3_scale(low, &s) - low / 8.0).abs() < 1e-12);
        // In between: strictly between the two.
        let mid = 2.0 * std::f32::consts::PI / 4096.0;
        let v = llama3_scale(mid, &s);
        assert!(v < mid && v > mid / 8.0);
    }

    #[test]
    fn rotation_preserves_norm_and_is_identity_at_zero() {
        let rope = Rope {
            theta: 10_000.0,
            llama3: None,
        };
        let inv = inverse_frequencies(&rope, 8, Device::Cpu);
        let x = Tensor::randn([1, 2, 3, 8], (Kind::Float, Device::Cpu));
        let positions = Tensor::from_slice(&[0i64, 5, 9]).unsqueeze(0);
        let (cos, sin) = cos_sin(&inv, &positions, Kind::Float);
        let y = apply(&x, &cos, &sin);
        let norm = |t: &Tensor| {
            t.square()
                .sum_dim_intlist([-1i64].as_slice(), false, Kind::Float)
        };
        assert!(norm(&y).allclose(&norm(&x), 1e-5, 1e-5, false));
        assert!(y
            .narrow(2, 0, 1)
            .allclose(&x.narrow(2, 0, 1), 1e-6, 1e-6, false));
    }
}
