//! libtorch's fused AdamW (`at::_fused_adamw_`) through the shim (`shim/optim.cpp`): one
//! multi-tensor kernel for all parameters on a GPU, a vectorised loop on the CPU.

use crate::tch::Tensor;

/// The fused step failed or is not in this build.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    #[error(
        "fused AdamW is not in this build (the PyTorch headers were not found when it was built)"
    )]
    Unavailable,
    #[error("fused AdamW: {0}")]
    Failed(String),
}

/// Whether this build has the fused step.
pub fn fused_adamw_available() -> bool {
    cfg!(ooze_fused_adamw)
}

/// AdamW hyper-parameters of one step (decoupled weight decay: `p ← p − lr·wd·p` before the
/// Adam update, as `torch.optim.AdamW`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

#[cfg(ooze_fused_adamw)]
mod ffi {
    use std::ffi::{c_char, c_void};
    extern "C" {
        pub fn ooze_optim_last_error() -> *const c_char;
        pub fn ooze_fused_adamw(
            params: *const *mut c_void,
            grads: *const *mut c_void,
            exp_avgs: *const *mut c_void,
            exp_avg_sqs: *const *mut c_void,
            steps: *const *mut c_void,
            n: i64,
            lr: f64,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
            grad_scale: *const c_void,
        ) -> i32;
        pub fn ooze_foreach_norm(tensors: *const *mut c_void, n: i64) -> *mut c_void;
        pub fn ooze_foreach_copy(dst: *const *mut c_void, src: *const *mut c_void, n: i64) -> i32;
        pub fn ooze_clear_grad(t: *mut c_void);
    }
}

#[cfg(ooze_fused_adamw)]
fn last_error() -> OptimError {
    // SAFETY: a thread-local NUL-terminated string set by the failing call.
    let message = unsafe { std::ffi::CStr::from_ptr(ffi::ooze_optim_last_error()) }
        .to_string_lossy()
        .into_owned();
    OptimError::Failed(message)
}

#[cfg(ooze_fused_adamw)]
fn handles(ts: &[Tensor]) -> Vec<*mut std::ffi::c_void> {
    ts.iter().map(|t| t.as_ptr() as *mut _).collect()
}

/// The L2 norm of every tensor, as one fp32 tensor `[n]` (one multi-tensor kernel on a GPU;
/// 16-bit tensors are summed in fp32).
pub fn foreach_norm(tensors: &[Tensor]) -> Result<Tensor, OptimError> {
    #[cfg(ooze_fused_adamw)]
    {
        let h = handles(tensors);
        // SAFETY: live tensors; a non-null result is a heap-allocated at::Tensor we now own.
        let raw = unsafe { ffi::ooze_foreach_norm(h.as_ptr(), h.len() as i64) };
        if raw.is_null() {
            return Err(last_error());
        }
        // SAFETY: see above.
        Ok(unsafe { Tensor::from_ptr(raw.cast()) })
    }
    #[cfg(not(ooze_fused_adamw))]
    Ok(Tensor::stack(
        &tensors
            .iter()
            .map(|t| t.norm().to_kind(crate::tch::Kind::Float))
            .collect::<Vec<_>>(),
        0,
    ))
}

/// Drops `t`'s gradient, freeing its memory (without the shim: zeroes it, which keeps the memory).
pub fn clear_grad(t: &mut Tensor) {
    #[cfg(ooze_fused_adamw)]
    // SAFETY: a live tensor; only its gradient slot changes.
    unsafe {
        ffi::ooze_clear_grad(t.as_mut_ptr().cast())
    };
    #[cfg(not(ooze_fused_adamw))]
    t.zero_grad();
}

/// `dst[i] ← src[i]` (with dtype conversion), one multi-tensor kernel on a GPU.
pub fn foreach_copy(dst: &mut [Tensor], src: &[Tensor]) -> Result<(), OptimError> {
    assert_eq!(dst.len(), src.len(), "invariant: parallel copy lists");
    #[cfg(ooze_fused_adamw)]
    {
        let (d, s) = (handles(dst), handles(src));
        // SAFETY: live tensors; the shim copies data in place.
        if unsafe { ffi::ooze_foreach_copy(d.as_ptr(), s.as_ptr(), d.len() as i64) } != 0 {
            return Err(last_error());
        }
        Ok(())
    }
    #[cfg(not(ooze_fused_adamw))]
    {
        for (d, s) in dst.iter_mut().zip(src) {
            d.copy_(s);
        }
        Ok(())
    }
}

/// One AdamW step, in place, over parallel lists: parameters (fp32), their gradients, first and
/// second moments, and per-parameter step counters (fp32 scalars on the parameters' device),
/// which this increments before the update (as `torch.optim.AdamW` does). All tensors on one
/// device. `grad_scale` (an fp32 scalar tensor there) divides every gradient inside the kernel.
#[allow(unused_variables)]
pub fn fused_adamw(
    params: &mut [Tensor],
    grads: &[Tensor],
    exp_avgs: &mut [Tensor],
    exp_avg_sqs: &mut [Tensor],
    steps: &mut [Tensor],
    hyper: AdamW,
    grad_scale: Option<&Tensor>,
) -> Result<(), OptimError> {
    let n = params.len();
    assert!(
        grads.len() == n && exp_avgs.len() == n && exp_avg_sqs.len() == n && steps.len() == n,
        "invariant: parallel AdamW lists"
    );
    #[cfg(ooze_fused_adamw)]
    {
        // The shim increments the step counters (one multi-tensor kernel) before the update.
        let (p, g, m, v, s) = (
            handles(params),
            handles(grads),
            handles(exp_avgs),
            handles(exp_avg_sqs),
            handles(steps),
        );
        // SAFETY: each pointer is a live at::Tensor owned by the slices above, which outlive the
        // call; the shim only reads the handles and updates the tensors' data in place.
        let code = unsafe {
            ffi::ooze_fused_adamw(
                p.as_ptr(),
                g.as_ptr(),
                m.as_ptr(),
                v.as_ptr(),
                s.as_ptr(),
                n as i64,
                hyper.lr,
                hyper.beta1,
                hyper.beta2,
                hyper.weight_decay,
                hyper.eps,
                grad_scale.map_or(std::ptr::null(), |t| t.as_ptr().cast()),
            )
        };
        if code != 0 {
            return Err(last_error());
        }
        Ok(())
    }
    #[cfg(not(ooze_fused_adamw))]
    Err(OptimError::Unavailable)
}

/// One parameter of [`master_adamw`]: its bf16 gradient and model weight, fp32 master weight,
/// moments and step counter (scalar), and its weight decay.
pub struct MasterSlot<'a> {
    pub grad: &'a Tensor,
    pub model: &'a Tensor,
    pub master: &'a Tensor,
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
    pub step: &'a Tensor,
    pub weight_decay: f64,
}

/// Whether [`master_adamw`] is in this build and on (ooze's CUDA kernels).
pub fn master_adamw_available() -> bool {
    crate::kernels::available()
}

#[cfg(ooze_cuda_kernels)]
mod master_ffi {
    use std::ffi::c_void;
    extern "C" {
        pub fn ooze_master_adamw(
            grads: *const *mut c_void,
            masters: *const *mut c_void,
            exp_avgs: *const *mut c_void,
            exp_avg_sqs: *const *mut c_void,
            models: *const *mut c_void,
            steps: *const *mut c_void,
            weight_decays: *const f64,
            n: i64,
            lr: f64,
            beta1: f64,
            beta2: f64,
            eps: f64,
            divisor: *const c_void,
        ) -> i32;
    }
}

/// One AdamW step over fp32 master weights with bf16 gradients, written back to the bf16 model
/// weights, in one pass over each parameter on a GPU (ooze's kernel; the arithmetic of
/// [`fused_adamw`]): no fp32 copy of the gradients and no separate copy of the masters down to
/// the model. Increments the step counters first. `divisor` (an fp32 scalar on the GPU) divides
/// every gradient (clipping); where it is not finite (a non-finite gradient norm), the step is
/// skipped on the device: nothing changes, the step counters included, and nothing waits for the
/// norm before the launch. `hyper.weight_decay` is unused: each slot has its own.
#[allow(unused_variables)]
pub fn master_adamw(
    slots: &[MasterSlot<'_>],
    hyper: AdamW,
    divisor: &Tensor,
) -> Result<(), OptimError> {
    #[cfg(ooze_cuda_kernels)]
    {
        type Pick = dyn Fn(&MasterSlot<'_>) -> *mut std::ffi::c_void;
        let handle =
            |pick: &Pick| -> Vec<*mut std::ffi::c_void> { slots.iter().map(pick).collect() };
        let (g, p, m, v, w, st) = (
            handle(&|s| s.grad.as_ptr() as *mut _),
            handle(&|s| s.master.as_ptr() as *mut _),
            handle(&|s| s.exp_avg.as_ptr() as *mut _),
            handle(&|s| s.exp_avg_sq.as_ptr() as *mut _),
            handle(&|s| s.model.as_ptr() as *mut _),
            handle(&|s| s.step.as_ptr() as *mut _),
        );
        let decays: Vec<f64> = slots.iter().map(|s| s.weight_decay).collect();
        // SAFETY: each pointer is a live at::Tensor borrowed by `slots` for the call; the shim
        // checks them and updates their data in place.
        let code = unsafe {
            master_ffi::ooze_master_adamw(
                g.as_ptr(),
                p.as_ptr(),
                m.as_ptr(),
                v.as_ptr(),
                w.as_ptr(),
                st.as_ptr(),
                decays.as_ptr(),
                slots.len() as i64,
                hyper.lr,
                hyper.beta1,
                hyper.beta2,
                hyper.eps,
                divisor.as_ptr().cast(),
            )
        };
        if code != 0 {
            let message = crate::kernels::ffi::last_error();
            return Err(OptimError::Failed(message));
        }
        Ok(())
    }
    #[cfg(not(ooze_cuda_kernels))]
    Err(OptimError::Unavailable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tch::{Device, Kind};

    /// The fused step against AdamW written out (torch.optim.AdamW's formula).
    #[test]
    fn fused_adamw_matches_the_formula() {
        if !fused_adamw_available() {
            return;
        }
        let opts = (Kind::Float, Device::Cpu);
        let p0 = Tensor::from_slice(&[0.5f32, -1.0, 2.0]);
        let g = Tensor::from_slice(&[0.1f32, -0.2, 0.3]);
        let hyper = AdamW {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            weight_decay: 0.1,
            eps: 1e-8,
        };
        let mut params = [p0.copy()];
        let mut m = [Tensor::zeros([3], opts)];
        let mut v = [Tensor::zeros([3], opts)];
        let mut steps = [Tensor::zeros([], opts)];
        for _ in 0..2 {
            fused_adamw(
                &mut params,
                std::slice::from_ref(&g),
                &mut m,
                &mut v,
                &mut steps,
                hyper,
                None,
            )
            .unwrap();
        }
        // Written out for two steps with the same gradient.
        let mut p = p0.copy();
        let (mut m1, mut v1) = (Tensor::zeros([3], opts), Tensor::zeros([3], opts));
        for t in 1..=2 {
            p = &p * (1.0 - hyper.lr * hyper.weight_decay);
            m1 = &m1 * hyper.beta1 + &g * (1.0 - hyper.beta1);
            v1 = &v1 * hyper.beta2 + g.square() * (1.0 - hyper.beta2);
            let mhat = &m1 / (1.0 - hyper.beta1.powi(t));
            let vhat = &v1 / (1.0 - hyper.beta2.powi(t));
            p -= mhat / (vhat.sqrt() + hyper.eps) * hyper.lr;
        }
        assert!(
            params[0].allclose(&p, 1e-6, 1e-7, false),
            "{params:?} vs {p:?}"
        );
        assert_eq!(steps[0].double_value(&[]), 2.0);
    }
}
