//! Host ↔ GPU copies that do not stop the host. A plain copy between pageable host memory and a
//! GPU (what `to_device` and `copy_` do) waits for everything queued on the stream. The engine
//! overlaps a decode step's GPU work with the host's handling of the step before, so it uploads
//! through pinned memory without waiting ([`upload`]) and reads results back through a
//! [`Download`] that waits only for the work queued before it.

use tch::kind::Element;
use tch::{Device, Tensor};

#[cfg(ooze_cuda_graphs)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};
    extern "C" {
        pub fn ooze_shim_last_error() -> *const c_char;
        pub fn ooze_upload(host: *const c_void, device: c_int) -> *mut c_void;
        pub fn ooze_event_record(device: c_int) -> *mut c_void;
        pub fn ooze_event_synchronize(event: *mut c_void) -> c_int;
        pub fn ooze_event_free(event: *mut c_void);
    }
}

#[cfg(ooze_cuda_graphs)]
fn last_error() -> String {
    // SAFETY: the shim returns a pointer to a thread-local, NUL-terminated string that lives until
    // the next failing call on this thread.
    unsafe { std::ffi::CStr::from_ptr(ffi::ooze_shim_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// `values` as a tensor on `device`. On a GPU the copy is queued from pinned memory and the call
/// returns at once (PyTorch's pinned-memory pool keeps the staging buffer until the copy is done);
/// on the CPU it is a plain tensor.
pub fn upload<T: Element>(values: &[T], device: Device) -> Tensor {
    let host = Tensor::from_slice(values);
    match device {
        #[cfg(ooze_cuda_graphs)]
        Device::Cuda(i) => {
            // SAFETY: a CPU tensor and a device index; the shim returns a new tensor or null.
            let raw = unsafe { ffi::ooze_upload(host.as_ptr().cast(), i as std::ffi::c_int) };
            if raw.is_null() {
                panic!("uploading to the GPU failed: {}", last_error());
            }
            // SAFETY: an `at::Tensor*` the shim allocated for the caller to own.
            unsafe { Tensor::from_ptr(raw.cast()) }
        }
        Device::Cpu => host,
        _ => host.to_device(device),
    }
}

/// A copy of a tensor into host memory, queued on the GPU stream behind the work that computes it.
pub struct Download {
    host: Tensor,
    #[cfg(ooze_cuda_graphs)]
    event: Option<Event>,
}

impl Download {
    /// Queues the copy of `t` to the host. Work queued after this call does not delay
    /// [`Download::wait`].
    pub fn start(t: &Tensor) -> Download {
        match t.device() {
            #[cfg(ooze_cuda_graphs)]
            Device::Cuda(i) => {
                // A non-blocking copy to the CPU lands in pinned memory.
                let host = t.to_device_(Device::Cpu, t.kind(), true, false);
                Download {
                    host,
                    event: Some(Event::record(i)),
                }
            }
            _ => Download {
                host: t.to_device(Device::Cpu),
                #[cfg(ooze_cuda_graphs)]
                event: None,
            },
        }
    }

    /// The tensor on the host, once the copy is done.
    pub fn wait(self) -> Tensor {
        #[cfg(ooze_cuda_graphs)]
        if let Some(event) = self.event {
            event.synchronize();
        }
        self.host
    }
}

/// A CUDA event recorded on this thread's current stream.
#[cfg(ooze_cuda_graphs)]
struct Event(*mut std::ffi::c_void);

// SAFETY: a CUDA event may be waited on and destroyed from any thread.
#[cfg(ooze_cuda_graphs)]
unsafe impl Send for Event {}

#[cfg(ooze_cuda_graphs)]
impl Event {
    fn record(device: usize) -> Event {
        // SAFETY: a device index; failures come back as null.
        let raw = unsafe { ffi::ooze_event_record(device as std::ffi::c_int) };
        if raw.is_null() {
            panic!("recording a CUDA event failed: {}", last_error());
        }
        Event(raw)
    }

    fn synchronize(&self) {
        // SAFETY: `self.0` came from ooze_event_record and is freed only by Drop.
        if unsafe { ffi::ooze_event_synchronize(self.0) } != 0 {
            panic!("waiting for a CUDA event failed: {}", last_error());
        }
    }
}

#[cfg(ooze_cuda_graphs)]
impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: freed exactly once.
        unsafe { ffi::ooze_event_free(self.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_and_downloads_keep_the_values_on_the_cpu() {
        let t = upload(&[3, -1, 7], Device::Cpu);
        assert_eq!(Vec::<i64>::try_from(&t).unwrap(), [3, -1, 7]);
        let back = Download::start(&(t * 2)).wait();
        assert_eq!(Vec::<i64>::try_from(&back).unwrap(), [6, -2, 14]);
    }
}
