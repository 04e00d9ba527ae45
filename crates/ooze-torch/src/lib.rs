//! ooze-torch: the one place ooze meets libtorch's runtime.
//!
//! - [`DeviceSpec`] and [`DtypeSpec`]: the `--device` / `--dtype` values users type, parsed once.
//! - [`runtime_info`]: PyTorch version, CUDA availability, GPU names and memory (`ooze info`).
//! - [`cuda_graph`] and [`kernels`]: CUDA graphs and ooze's own CUDA kernels, through the C++/CUDA
//!   shim in `shim/` (built when PyTorch has CUDA); [`optim`]: libtorch's fused AdamW.
//! - [`profiler`]: PyTorch's profiler, a Chrome trace of CPU operations and GPU kernels.
//! - [`transfer`]: host ↔ GPU copies that do not stop the host (the engine's overlapped steps).
//! - [`dist`]: ranks (torchrun's environment contract) and c10d's Gloo and NCCL collectives.
//!
//! Tensors themselves are `tch::Tensor`; this crate re-exports `tch` so downstream crates use the
//! same version.

pub mod cuda_driver;
pub mod cuda_graph;
pub mod dist;
pub mod kernels;
pub mod optim;
pub mod profiler;
pub mod spec;
pub mod transfer;

pub use spec::{DeviceSpec, DtypeSpec, SpecError};
pub use tch;

use serde::Serialize;

/// The PyTorch release ooze binds (tch 0.24).
pub const TORCH_VERSION: &str = "2.11.0";

/// What this process can compute on.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeInfo {
    pub torch_version: &'static str,
    pub cuda_available: bool,
    pub cudnn_available: bool,
    pub cuda_runtime_version: Option<String>,
    pub cpu_threads: i32,
    pub gpus: Vec<cuda_driver::GpuInfo>,
    /// Why GPU details are missing although CUDA is available (driver library not loadable, …).
    pub gpu_query_error: Option<String>,
}

/// Collects [`RuntimeInfo`]. Cheap; initialises CUDA if present.
pub fn runtime_info() -> RuntimeInfo {
    let cuda_available = tch::Cuda::is_available();
    let (gpus, gpu_query_error) = if cuda_available {
        match cuda_driver::list_gpus() {
            Ok(gpus) => (gpus, None),
            Err(err) => (Vec::new(), Some(err.to_string())),
        }
    } else {
        (Vec::new(), None)
    };
    let cudart = tch::utils::version_cudart();
    RuntimeInfo {
        torch_version: TORCH_VERSION,
        cuda_available,
        cudnn_available: tch::Cuda::cudnn_is_available(),
        cuda_runtime_version: (cuda_available && cudart > 0)
            .then(|| format!("{}.{}", cudart / 1000, (cudart % 1000) / 10)),
        cpu_threads: tch::get_num_threads(),
        gpus,
        gpu_query_error,
    }
}
