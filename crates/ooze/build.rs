//! Link settings of the `ooze` binary (and of this crate's tests): libtorch_cuda is linked with
//! `--no-as-needed` so one build computes on a GPU when one is present, and the torch/lib it was
//! built against (with the wheel's CUDA runtime, nvidia/cu13/lib) becomes a run path, so the binary
//! of a plain `cargo build` runs in a clean environment. These are RUNPATH entries (the linker's
//! default new dtags, made explicit): `LD_LIBRARY_PATH`, set by scripts/torch-env.sh, still wins, so
//! a binary carried to another machine uses that machine's PyTorch 2.11.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Ok(lib) = std::env::var("DEP_OOZE_TORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if let Ok(cudart) = std::env::var("DEP_OOZE_TORCH_CUDART") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{cudart}");
    }
    if std::env::var("DEP_OOZE_TORCH_CUDA").as_deref() == Ok("true") {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-L{lib}");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-lc10_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
