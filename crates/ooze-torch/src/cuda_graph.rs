//! CUDA graphs through the C++ shim (tch has no binding): capture a sequence of GPU work once,
//! replay it with one launch. Inputs and outputs must live in tensors allocated before capture and
//! refilled in place before each replay; nothing captured may synchronise with the host.

#[cfg(ooze_cuda_graphs)]
use std::ffi::{c_char, c_int, CStr};

/// Capture or replay failed, or the build has no shim (PyTorch without CUDA).
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("CUDA graphs are not available in this build (PyTorch without CUDA, or the shim did not compile)")]
    Unavailable,
    #[error("CUDA graph {stage} failed: {message}")]
    Failed {
        stage: &'static str,
        message: String,
    },
}

#[cfg(ooze_cuda_graphs)]
mod ffi {
    use super::*;
    #[repr(C)]
    pub struct OozeGraph {
        _private: [u8; 0],
    }
    extern "C" {
        pub fn ooze_shim_last_error() -> *const c_char;
        pub fn ooze_graph_new() -> *mut OozeGraph;
        pub fn ooze_graph_capture_begin(
            g: *mut OozeGraph,
            device: c_int,
            share: *mut OozeGraph,
        ) -> c_int;
        pub fn ooze_graph_capture_end(g: *mut OozeGraph) -> c_int;
        pub fn ooze_graph_replay(g: *mut OozeGraph) -> c_int;
        pub fn ooze_graph_free(g: *mut OozeGraph);
        pub fn ooze_stream_synchronize(device: c_int) -> c_int;
        pub fn ooze_cuda_peak_allocated(device: c_int, reset: c_int) -> i64;
        pub fn ooze_set_gemm_reduction(mode: c_int) -> c_int;
    }
}

#[cfg(ooze_cuda_graphs)]
fn failed(stage: &'static str) -> GraphError {
    // SAFETY: the shim returns a pointer to a thread-local, NUL-terminated string that lives
    // until the next failing call on this thread.
    let message = unsafe { CStr::from_ptr(ffi::ooze_shim_last_error()) }
        .to_string_lossy()
        .into_owned();
    GraphError::Failed { stage, message }
}

/// Held while a graph is captured or destroyed: several engines in one process (a policy and its
/// helpers) capture on their own threads, and a capture must not overlap another's, nor a graph's
/// destruction.
static CAPTURE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn capture_lock() -> std::sync::MutexGuard<'static, ()> {
    // A panic during another capture leaves nothing to repair: the guard protects no data.
    CAPTURE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The most bytes the CUDA caching allocator has had allocated on `device` since the last call
/// with `reset` (which starts the count again from now); `None` without CUDA.
pub fn peak_allocated(device: usize, reset: bool) -> Option<u64> {
    #[cfg(ooze_cuda_graphs)]
    {
        // SAFETY: a device index; failures come back as -1.
        let peak = unsafe { ffi::ooze_cuda_peak_allocated(device as c_int, reset as c_int) };
        u64::try_from(peak).ok()
    }
    #[cfg(not(ooze_cuda_graphs))]
    {
        let _ = (device, reset);
        None
    }
}

/// Waits until the work this thread queued on `device` (its current stream) is done. Use it
/// instead of `tch::Cuda::synchronize`, which synchronises the whole device: that is refused while
/// another thread captures a CUDA graph, and it breaks that capture.
pub fn synchronize(device: usize) {
    #[cfg(ooze_cuda_graphs)]
    // SAFETY: the shim takes a device index and reports failures through its return value.
    unsafe {
        if ffi::ooze_stream_synchronize(device as c_int) != 0 {
            panic!(
                "CUDA stream synchronisation failed: {}",
                failed("synchronize")
            );
        }
    }
    #[cfg(not(ooze_cuda_graphs))]
    tch::Cuda::synchronize(device as i64);
}

/// A captured CUDA graph.
pub struct CudaGraph {
    #[cfg(ooze_cuda_graphs)]
    raw: *mut ffi::OozeGraph,
}

// SAFETY: a CUDA graph may be replayed from any thread; the engine owns each one on one thread.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Whether this build can capture graphs.
    pub fn available() -> bool {
        cfg!(ooze_cuda_graphs)
    }

    /// Captures the GPU work `work` issues on device `device`. Run `work` once uncaptured first
    /// (warm-up), so lazily created handles and workspaces exist before capture. With `share`, the
    /// new graph uses that graph's memory pool (graphs sharing a pool must not run concurrently).
    #[cfg(ooze_cuda_graphs)]
    pub fn capture<R>(
        device: usize,
        share: Option<&CudaGraph>,
        work: impl FnOnce() -> R,
    ) -> Result<(CudaGraph, R), GraphError> {
        // SAFETY: the shim's functions take the pointer ooze_graph_new returned; the graph is freed
        // exactly once, by Drop (which takes the capture lock, so it is released before any return).
        unsafe {
            let raw = ffi::ooze_graph_new();
            if raw.is_null() {
                return Err(failed("creation"));
            }
            let graph = CudaGraph { raw };
            let share = share.map_or(std::ptr::null_mut(), |g| g.raw);
            let capturing = capture_lock();
            if ffi::ooze_graph_capture_begin(raw, device as c_int, share) != 0 {
                let err = failed("capture begin");
                drop(capturing);
                return Err(err);
            }
            let result = work();
            let ended = ffi::ooze_graph_capture_end(raw);
            let err = (ended != 0).then(|| failed("capture"));
            drop(capturing);
            match err {
                Some(err) => Err(err),
                None => Ok((graph, result)),
            }
        }
    }

    #[cfg(not(ooze_cuda_graphs))]
    pub fn capture<R>(
        _device: usize,
        _share: Option<&CudaGraph>,
        _work: impl FnOnce() -> R,
    ) -> Result<(CudaGraph, R), GraphError> {
        Err(GraphError::Unavailable)
    }

    /// Launches the captured work on the current stream.
    pub fn replay(&self) -> Result<(), GraphError> {
        #[cfg(ooze_cuda_graphs)]
        // SAFETY: `raw` is a live graph (see capture).
        unsafe {
            if ffi::ooze_graph_replay(self.raw) != 0 {
                return Err(failed("replay"));
            }
            Ok(())
        }
        #[cfg(not(ooze_cuda_graphs))]
        Err(GraphError::Unavailable)
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        #[cfg(ooze_cuda_graphs)]
        {
            let _capturing = capture_lock();
            // SAFETY: freed once; `raw` came from ooze_graph_new.
            unsafe { ffi::ooze_graph_free(self.raw) }
        }
    }
}

/// How cuBLAS may reduce the partial sums of a 16-bit matrix multiply split along its inner
/// dimension (libtorch's process-wide setting). Small-row GEMMs (a decode step) are the ones cuBLAS
/// splits, so this decides how far a decode step's results drift from a full-sequence forward's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmReduction {
    /// Split-K partial sums may be added in 16 bits (PyTorch's default).
    ReducedPrecision,
    /// No split-K: every output is one fp32 accumulation along the inner dimension.
    NoSplit,
}

/// Sets [`GemmReduction`] for bf16 and fp16 GEMMs in this process. Without CUDA there is nothing
/// to set.
#[allow(unused_variables)]
pub fn set_gemm_reduction(mode: GemmReduction) -> Result<(), GraphError> {
    #[cfg(ooze_cuda_graphs)]
    {
        let code = match mode {
            GemmReduction::ReducedPrecision => 0,
            GemmReduction::NoSplit => 2,
        };
        // SAFETY: a plain setter on libtorch's global context.
        if unsafe { ffi::ooze_set_gemm_reduction(code) } != 0 {
            return Err(failed("gemm reduction setting"));
        }
    }
    Ok(())
}
