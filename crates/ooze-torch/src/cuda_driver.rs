//! GPU names and memory from the CUDA driver API (`libcuda.so.1`, loaded at run time, so the binary
//! needs no CUDA headers and still starts on machines without a driver). tch exposes device counts but
//! not names or memory.

use serde::Serialize;
use std::ffi::{c_char, c_int, CStr};

/// One visible GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    pub index: usize,
    pub name: String,
    pub total_memory_bytes: u64,
    pub compute_capability: (i32, i32),
    pub multiprocessors: i32,
}

/// The driver library could not be loaded or answered with an error.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("cannot load the CUDA driver library libcuda.so.1")]
    Load(#[source] libloading::Error),
    #[error("CUDA driver call {call} failed with code {code}")]
    Call { call: &'static str, code: c_int },
}

type CuResult = c_int;
const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;

fn check(call: &'static str, code: CuResult) -> Result<(), DriverError> {
    if code == 0 {
        Ok(())
    } else {
        Err(DriverError::Call { call, code })
    }
}

/// Free and total memory of GPU `index`, in bytes, as the driver reports them now.
pub fn memory_info(index: usize) -> Result<(u64, u64), DriverError> {
    // SAFETY: documented CUDA driver API signatures; the primary context is retained and released
    // around the query, and pushed/popped so the caller's current context is unchanged.
    unsafe {
        let lib = libloading::Library::new("libcuda.so.1").map_err(DriverError::Load)?;
        let sym = |name: &[u8]| lib.get::<*const ()>(name).map_err(DriverError::Load);
        let cu_init: extern "C" fn(u32) -> CuResult = std::mem::transmute(*sym(b"cuInit\0")?);
        let get_device: extern "C" fn(*mut c_int, c_int) -> CuResult =
            std::mem::transmute(*sym(b"cuDeviceGet\0")?);
        let retain: extern "C" fn(*mut *mut std::ffi::c_void, c_int) -> CuResult =
            std::mem::transmute(*sym(b"cuDevicePrimaryCtxRetain\0")?);
        let release: extern "C" fn(c_int) -> CuResult =
            std::mem::transmute(*sym(b"cuDevicePrimaryCtxRelease_v2\0")?);
        let push: extern "C" fn(*mut std::ffi::c_void) -> CuResult =
            std::mem::transmute(*sym(b"cuCtxPushCurrent_v2\0")?);
        let pop: extern "C" fn(*mut *mut std::ffi::c_void) -> CuResult =
            std::mem::transmute(*sym(b"cuCtxPopCurrent_v2\0")?);
        let mem_info: extern "C" fn(*mut usize, *mut usize) -> CuResult =
            std::mem::transmute(*sym(b"cuMemGetInfo_v2\0")?);
        check("cuInit", cu_init(0))?;
        let mut device = 0;
        check("cuDeviceGet", get_device(&mut device, index as c_int))?;
        let mut ctx = std::ptr::null_mut();
        check("cuDevicePrimaryCtxRetain", retain(&mut ctx, device))?;
        check("cuCtxPushCurrent", push(ctx))?;
        let (mut free, mut total) = (0usize, 0usize);
        let result = check("cuMemGetInfo", mem_info(&mut free, &mut total));
        let mut popped = std::ptr::null_mut();
        pop(&mut popped);
        release(device);
        result.map(|()| (free as u64, total as u64))
    }
}

/// Lists the GPUs the driver sees (respecting `CUDA_VISIBLE_DEVICES`).
pub fn list_gpus() -> Result<Vec<GpuInfo>, DriverError> {
    // SAFETY: the signatures below are the CUDA driver API's documented C ABI, stable since CUDA 3.2
    // (the `_v2` memory query); the library stays loaded for the duration of this function.
    unsafe {
        let lib = libloading::Library::new("libcuda.so.1").map_err(DriverError::Load)?;
        let sym = |name: &[u8]| lib.get::<*const ()>(name).map_err(DriverError::Load);
        let cu_init: extern "C" fn(u32) -> CuResult = std::mem::transmute(*sym(b"cuInit\0")?);
        let get_count: extern "C" fn(*mut c_int) -> CuResult =
            std::mem::transmute(*sym(b"cuDeviceGetCount\0")?);
        let get_device: extern "C" fn(*mut c_int, c_int) -> CuResult =
            std::mem::transmute(*sym(b"cuDeviceGet\0")?);
        let get_name: extern "C" fn(*mut c_char, c_int, c_int) -> CuResult =
            std::mem::transmute(*sym(b"cuDeviceGetName\0")?);
        let total_mem: extern "C" fn(*mut usize, c_int) -> CuResult =
            std::mem::transmute(*sym(b"cuDeviceTotalMem_v2\0")?);
        let get_attr: extern "C" fn(*mut c_int, c_int, c_int) -> CuResult =
            std::mem::transmute(*sym(b"cuDeviceGetAttribute\0")?);

        check("cuInit", cu_init(0))?;
        let mut count = 0;
        check("cuDeviceGetCount", get_count(&mut count))?;
        let mut gpus = Vec::with_capacity(count.max(0) as usize);
        for index in 0..count {
            let mut device = 0;
            check("cuDeviceGet", get_device(&mut device, index))?;
            let mut name = [0 as c_char; 256];
            check(
                "cuDeviceGetName",
                get_name(name.as_mut_ptr(), name.len() as c_int, device),
            )?;
            let mut bytes = 0usize;
            check("cuDeviceTotalMem_v2", total_mem(&mut bytes, device))?;
            let attr = |which| {
                let mut value = 0;
                check("cuDeviceGetAttribute", get_attr(&mut value, which, device)).map(|_| value)
            };
            gpus.push(GpuInfo {
                index: index as usize,
                name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
                total_memory_bytes: bytes as u64,
                compute_capability: (attr(ATTR_CC_MAJOR)?, attr(ATTR_CC_MINOR)?),
                multiprocessors: attr(ATTR_MULTIPROCESSOR_COUNT)?,
            });
        }
        Ok(gpus)
    }
}

/// Dense bf16 tensor-core peak of a GPU model, FLOP/s (for MFU), when ooze knows it.
pub fn bf16_peak_flops(name: &str) -> Option<f64> {
    [
        ("H200", 989e12),
        ("H100", 989e12),
        ("A100", 312e12),
        ("L40S", 362e12),
    ]
    .iter()
    .find(|(key, _)| name.contains(key))
    .map(|&(_, peak)| peak)
}

/// The bf16 peak of CUDA device `index`, when its name is known.
pub fn device_bf16_peak(index: usize) -> Option<f64> {
    list_gpus()
        .ok()?
        .into_iter()
        .nth(index)
        .and_then(|g| bf16_peak_flops(&g.name))
}
