//! Takes the torch/lib directory of the PyTorch that tch builds against from torch-sys and publishes
//! it, and the wheel's CUDA runtime directory, to the build scripts of dependent crates
//! (`DEP_OOZE_TORCH_LIB`, `DEP_OOZE_TORCH_CUDA`, `DEP_OOZE_TORCH_CUDART`). The `ooze`
//! binary crate uses them to link libtorch_cuda with `--no-as-needed` (PyTorch registers its CUDA
//! kernels in that library's static initialisers, and no symbol of it is referenced, so the linker
//! would drop it) and to record the directories as run paths.
//!
//! When that PyTorch has CUDA, it also compiles the C++ shim (`shim/cuda_graph.cpp`, CUDA graphs;
//! `shim/profiler.cpp`, PyTorch's profiler) against the libtorch headers and CUDA's host headers
//! from the nvidia wheels, and sets
//! `cfg(ooze_cuda_graphs)`; and, when the nvidia-cuda-nvcc wheel's compiler is there, ooze's CUDA
//! kernels (`shim/*.cu`: elementwise, norms, attention, sampling, the master-weight AdamW; their
//! checked entry points in `shim/ops.cpp`, `shim/attention_ops.cpp` (with cuDNN's fused attention
//! over slots in `shim/slot_attention.cpp`) and `shim/master_adamw_ops.cpp`) for A100 (sm_80), H100/H200 (sm_90) and PTX for
//! newer GPUs, setting `cfg(ooze_cuda_kernels)`. Without them the same steps run as libtorch
//! operations.

use std::path::{Path, PathBuf};

/// The torch/lib directory that tch links against, as torch-sys reports it (`DEP_TCH_LIBTORCH_LIB`),
/// with symbolic links resolved so that the run paths recorded from it also hold for the libraries'
/// own `$ORIGIN`-relative run paths. torch-sys finds PyTorch through `LIBTORCH_USE_PYTORCH` (the torch of
/// the `python` of an active virtualenv, else `python3`) or `LIBTORCH`; .cargo/config.toml defaults the
/// latter to `.cache/libtorch`, the link to the repository .venv's torch that scripts/setup.sh makes.
fn torch_lib_dir() -> Result<PathBuf, String> {
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .map_err(|_| "torch-sys did not report its libtorch directory".to_string())?;
    // A re-created .venv behind the same link: record the run paths again.
    println!("cargo:rerun-if-changed={lib}");
    Path::new(&lib)
        .canonicalize()
        .map_err(|e| format!("libtorch directory {lib}: {e}"))
}

/// `cargo test` and `cargo run` put the link-search directories that lie in the target directory on
/// the loader's path: links there to torch/lib and the wheel's CUDA runtime let the test binaries of
/// every crate (which, unlike the `ooze` binary, record no run path) find libtorch without
/// scripts/torch-env.sh. A binary run directly does not see them.
fn link_for_cargo_run(lib: &Path) {
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let cudart = lib.join("../../nvidia/cu13/lib");
    for (name, dir) in [("torch-lib", lib), ("cuda-lib", cudart.as_path())] {
        let link = out.join(name);
        let _ = std::fs::remove_file(&link);
        if dir.is_dir() && std::os::unix::fs::symlink(dir, &link).is_ok() {
            println!("cargo:rustc-link-search=native={}", link.display());
        }
    }
}

fn compile_shim(lib: &Path) -> Result<(), String> {
    let torch = lib.parent().ok_or("torch/lib has no parent")?;
    let cuda_include = torch.join("../nvidia/cu13/include");
    if !cuda_include.join("cuda_runtime_api.h").exists() {
        return Err(format!(
            "CUDA host headers not found in {}",
            cuda_include.display()
        ));
    }
    println!("cargo:rerun-if-changed=shim/cuda_graph.cpp");
    println!("cargo:rerun-if-changed=shim/profiler.cpp");
    cc::Build::new()
        .cpp(true)
        .file("shim/cuda_graph.cpp")
        .file("shim/profiler.cpp")
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .include(&cuda_include)
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .debug(false)
        .warnings(false)
        .try_compile("ooze_shim")
        .map_err(|e| e.to_string())?;
    println!("cargo:rustc-link-search=native={}", lib.display());
    for name in ["torch_cuda", "c10_cuda", "torch_cpu", "c10"] {
        println!("cargo:rustc-link-lib=dylib={name}");
    }
    // Inline code of the CUDA headers calls the runtime directly. The wheel ships only the
    // versioned file, so link it by name; at run time it is found next to torch (torch-env.sh).
    let cudart = torch.join("../nvidia/cu13/lib");
    println!("cargo:rustc-link-search=native={}", cudart.display());
    println!("cargo:rustc-link-lib=dylib:+verbatim=libcudart.so.13");
    Ok(())
}

/// Compiles the CUDA kernels with the wheel's nvcc and their C++ entry points.
fn compile_kernels(lib: &Path) -> Result<(), String> {
    let torch = lib.parent().ok_or("torch/lib has no parent")?;
    let cuda = torch.join("../nvidia/cu13");
    let nvcc = cuda.join("bin/nvcc");
    if !nvcc.exists() {
        return Err(format!("nvcc not found at {}", nvcc.display()));
    }
    println!("cargo:rerun-if-changed=shim/kernels.cu");
    println!("cargo:rerun-if-changed=shim/attention.cu");
    println!("cargo:rerun-if-changed=shim/fa_order_attention.cu");
    println!("cargo:rerun-if-changed=shim/rms_norm.cu");
    println!("cargo:rerun-if-changed=shim/sample.cu");
    println!("cargo:rerun-if-changed=shim/master_adamw.cu");
    println!("cargo:rerun-if-changed=shim/master_adamw.h");
    println!("cargo:rerun-if-changed=shim/master_adamw_ops.cpp");
    println!("cargo:rerun-if-changed=shim/rms_norm.cuh");
    println!("cargo:rerun-if-changed=shim/attention_common.cuh");
    println!("cargo:rerun-if-changed=shim/common.cuh");
    println!("cargo:rerun-if-changed=shim/ops.h");
    println!("cargo:rerun-if-changed=shim/ops.cpp");
    println!("cargo:rerun-if-changed=shim/attention_ops.cpp");
    println!("cargo:rerun-if-changed=shim/slot_attention.cpp");
    cc::Build::new()
        .cuda(true)
        .file("shim/kernels.cu")
        .file("shim/attention.cu")
        .file("shim/fa_order_attention.cu")
        .file("shim/rms_norm.cu")
        .file("shim/sample.cu")
        .file("shim/master_adamw.cu")
        .include(cuda.join("include"))
        .debug(false)
        .opt_level(3)
        .flag("-gencode=arch=compute_80,code=sm_80")
        .flag("-gencode=arch=compute_90,code=sm_90")
        .flag("-gencode=arch=compute_90,code=compute_90")
        .warnings(false)
        .try_compile("ooze_kernels")
        .map_err(|e| e.to_string())?;
    cc::Build::new()
        .cpp(true)
        .file("shim/ops.cpp")
        .file("shim/attention_ops.cpp")
        .file("shim/slot_attention.cpp")
        .file("shim/master_adamw_ops.cpp")
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .include(cuda.join("include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .debug(false)
        .warnings(false)
        .try_compile("ooze_ops")
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// libtorch's fused AdamW entry point (ATen headers only, with or without CUDA).
fn compile_optim(lib: &Path) -> Result<(), String> {
    let torch = lib.parent().ok_or("torch/lib has no parent")?;
    println!("cargo:rerun-if-changed=shim/optim.cpp");
    cc::Build::new()
        .cpp(true)
        .file("shim/optim.cpp")
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .debug(false)
        .warnings(false)
        .try_compile("ooze_optim")
        .map_err(|e| e.to_string())?;
    println!("cargo:rustc-link-search=native={}", lib.display());
    for name in ["torch_cpu", "c10"] {
        println!("cargo:rustc-link-lib=dylib={name}");
    }
    Ok(())
}

/// c10d's process groups and store (`shim/dist.cpp`): Gloo always (with the Gloo declarations in
/// `shim/gloo/`, which the wheel does not ship), NCCL when this PyTorch has CUDA (the headers of
/// the wheel's nvidia-nccl package).
fn compile_dist(lib: &Path, cuda: bool) -> Result<bool, String> {
    let torch = lib.parent().ok_or("torch/lib has no parent")?;
    println!("cargo:rerun-if-changed=shim/dist.cpp");
    println!("cargo:rerun-if-changed=shim/gloo");
    let nccl = torch.join("../nvidia/nccl/include");
    let cuda_include = torch.join("../nvidia/cu13/include");
    let with_nccl = cuda && nccl.join("nccl.h").exists() && cuda_include.is_dir();
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("shim/dist.cpp")
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .include("shim")
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .debug(false)
        .warnings(false);
    if with_nccl {
        build
            .define("OOZE_NCCL", None)
            .include(&nccl)
            .include(&cuda_include);
    }
    build.try_compile("ooze_dist").map_err(|e| e.to_string())?;
    println!("cargo:rustc-link-search=native={}", lib.display());
    let libs: &[&str] = if with_nccl {
        &["torch_cuda", "torch_cpu", "c10"]
    } else {
        &["torch_cpu", "c10"]
    };
    for name in libs {
        println!("cargo:rustc-link-lib=dylib={name}");
    }
    Ok(with_nccl)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(ooze_dist)");
    println!("cargo:rustc-check-cfg=cfg(ooze_nccl)");
    println!("cargo:rustc-check-cfg=cfg(ooze_fused_adamw)");
    println!("cargo:rustc-check-cfg=cfg(ooze_cuda_graphs)");
    println!("cargo:rustc-check-cfg=cfg(ooze_cuda_kernels)");
    let lib = match torch_lib_dir() {
        Ok(lib) => lib,
        Err(e) => {
            println!("cargo:warning=ooze-torch: {e}; building without CUDA and without run paths");
            return;
        }
    };
    println!("cargo:lib={}", lib.display());
    link_for_cargo_run(&lib);
    let cuda = lib.join("libtorch_cuda.so").exists();
    println!("cargo:cuda={cuda}");
    if cuda {
        // The CUDA runtime of the wheel: the shim links it, so the binary records it as a run path.
        if let Ok(cudart) = lib.join("../../nvidia/cu13/lib").canonicalize() {
            println!("cargo:cudart={}", cudart.display());
        }
    }
    // cc finds nvcc through NVCC (an explicit .compiler() would be treated as a C compiler); set
    // before the compiles start, since cc reads it on their threads.
    let nvcc = lib.join("../../nvidia/cu13/bin/nvcc");
    if cuda && nvcc.exists() {
        std::env::set_var("NVCC", &nvcc);
    }
    // Two threads (every C++ file includes ATen's headers, ~40 s each; cc compiles one library's
    // files in parallel, but the libraries came one after another): the CPU libraries on one; on
    // the other the CUDA ones, in order, since the kernels' entry points are only built, and
    // linked, once the shim is.
    std::thread::scope(|s| {
        s.spawn(|| {
            match compile_optim(&lib) {
                Ok(()) => println!("cargo:rustc-cfg=ooze_fused_adamw"),
                Err(e) => println!("cargo:warning=ooze-torch: fused AdamW not built ({e})"),
            }
            match compile_dist(&lib, cuda) {
                Ok(nccl) => {
                    println!("cargo:rustc-cfg=ooze_dist");
                    if nccl {
                        println!("cargo:rustc-cfg=ooze_nccl");
                    }
                }
                Err(e) => println!("cargo:warning=ooze-torch: collectives not built ({e})"),
            }
        });
        if cuda {
            s.spawn(|| compile_cuda(&lib));
        }
    });
}

/// The CUDA shim, then the kernels and their entry points; each step's cfg when it is built.
fn compile_cuda(lib: &Path) {
    if let Err(e) = compile_shim(lib) {
        println!("cargo:warning=ooze-torch: C++ shim not built ({e}); CUDA graphs disabled");
        return;
    }
    println!("cargo:rustc-cfg=ooze_cuda_graphs");
    match compile_kernels(lib) {
        Ok(()) => println!("cargo:rustc-cfg=ooze_cuda_kernels"),
        Err(e) => println!(
            "cargo:warning=ooze-torch: CUDA kernels not built ({e}); libtorch operations instead"
        ),
    }
}
