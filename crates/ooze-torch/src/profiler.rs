//! PyTorch's profiler (Kineto over CUPTI) through the shim (`shim/profiler.cpp`): a Chrome trace
//! of the CPU operations and every GPU kernel, copy and fill between [`Trace::start`] and
//! [`Trace::finish`] — what `torch.profiler` writes for a Python program, readable in Perfetto or
//! `chrome://tracing`.

use std::path::Path;

/// Recording could not start or the trace could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ProfilerError {
    #[error("PyTorch's profiler is not in this build (PyTorch without CUDA, or the shim did not compile)")]
    Unavailable,
    #[error("PyTorch's profiler: {0}")]
    Failed(String),
}

#[cfg(ooze_cuda_graphs)]
mod ffi {
    use std::ffi::{c_char, c_int};
    extern "C" {
        pub fn ooze_profiler_last_error() -> *const c_char;
        pub fn ooze_profiler_start(cuda: c_int) -> c_int;
        pub fn ooze_profiler_stop(path: *const c_char) -> c_int;
    }
}

#[cfg(ooze_cuda_graphs)]
fn failed() -> ProfilerError {
    // SAFETY: a thread-local NUL-terminated string set by the failing call.
    let message = unsafe { std::ffi::CStr::from_ptr(ffi::ooze_profiler_last_error()) }
        .to_string_lossy()
        .into_owned();
    ProfilerError::Failed(message)
}

/// A recording in progress (one per process at a time, PyTorch's rule).
pub struct Trace {
    _private: (),
}

impl Trace {
    /// Starts recording CPU operations and, with `cuda`, the GPU's activity.
    pub fn start(cuda: bool) -> Result<Trace, ProfilerError> {
        #[cfg(ooze_cuda_graphs)]
        {
            // SAFETY: no pointers; the shim catches every C++ exception.
            if unsafe { ffi::ooze_profiler_start(cuda as std::ffi::c_int) } != 0 {
                return Err(failed());
            }
            Ok(Trace { _private: () })
        }
        #[cfg(not(ooze_cuda_graphs))]
        {
            let _ = cuda;
            Err(ProfilerError::Unavailable)
        }
    }

    /// Stops recording and writes the Chrome trace (JSON) to `path`.
    pub fn finish(self, path: &Path) -> Result<(), ProfilerError> {
        #[cfg(ooze_cuda_graphs)]
        {
            use std::os::unix::ffi::OsStrExt;
            let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| {
                ProfilerError::Failed(format!("trace path {} holds a NUL byte", path.display()))
            })?;
            // SAFETY: a valid NUL-terminated path; the shim catches every C++ exception.
            if unsafe { ffi::ooze_profiler_stop(c_path.as_ptr()) } != 0 {
                return Err(failed());
            }
            Ok(())
        }
        #[cfg(not(ooze_cuda_graphs))]
        {
            let _ = path;
            Err(ProfilerError::Unavailable)
        }
    }
}
