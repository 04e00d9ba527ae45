//! Finds the torch/lib directory of the PyTorch that tch builds against and publishes it to the
//! build scripts of dependent crates (`DEP_OOZE_TORCH_LIB`, `DEP_OOZE_TORCH_CUDA`). The `ooze` binary
//! crate uses them to link libtorch_cuda with `--no-as-needed` (PyTorch registers its CUDA kernels in
//! that library's static initialisers, and no symbol of it is referenced, so the linker would drop
//! it) and to record the directory as a run path.

use std::path::PathBuf;
use std::process::Command;

fn torch_lib_dir() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=VIRTUAL_ENV");
    if let Ok(dir) = std::env::var("LIBTORCH") {
        return Some(PathBuf::from(dir).join("lib"));
    }
    let python = if std::env::var_os("VIRTUAL_ENV").is_some() {
        "python"
    } else {
        "python3"
    };
    let out = Command::new(python)
        .args([
            "-c",
            "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))",
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Some(lib) = torch_lib_dir() else {
        println!("cargo:warning=ooze-torch: could not locate torch/lib; building without CUDA");
        return;
    };
    println!("cargo:lib={}", lib.display());
    println!("cargo:cuda={}", lib.join("libtorch_cuda.so").exists());
}
