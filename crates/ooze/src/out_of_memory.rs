//! Out of memory, reported as an error. libtorch reports an allocation it cannot make by throwing,
//! and tch turns that into a panic carrying the C++ message and its backtrace; anywhere in any
//! thread. The hook installed here catches those panics, prints the allocator's own sentence
//! (what was asked for, what the GPU has) with what to change, and exits with status 1. Other
//! panics keep the default report.

/// What libtorch's allocators say when an allocation fails (CUDA and CPU).
const MARKERS: [&str; 3] = [
    "CUDA out of memory",
    "out of memory",
    "DefaultCPUAllocator: can't allocate memory",
];

/// The allocator's message without tch's wrapping and libtorch's C++ backtrace, when `panic`
/// is an allocation failure.
pub fn out_of_memory_message(panic: &str) -> Option<String> {
    if !MARKERS.iter().any(|m| panic.contains(m)) {
        return None;
    }
    let start = MARKERS
        .iter()
        .filter_map(|m| panic.find(m))
        .min()
        .unwrap_or(0);
    let text = &panic[start..];
    let end = ["Exception raised from", "\\n", "\n", "\")"]
        .iter()
        .filter_map(|m| text.find(m))
        .min()
        .unwrap_or(text.len());
    Some(text[..end].trim().trim_end_matches(['"', ')']).to_owned())
}

/// Installs the hook (once, at start).
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        match out_of_memory_message(payload) {
            Some(message) => {
                eprintln!(
                    "error: out of memory: {message}\n\
                     The memory plan did not foresee this allocation. Lower \
                     trainer.max_tokens_per_micro_batch (`--micro-batch-tokens`) or \
                     rollout.mem_fraction, turn on trainer.recompute_activations, or shard over \
                     more GPUs (trainer.sharding = \"sharded\", `--nproc-per-node`)."
                );
                std::process::exit(1);
            }
            None => default(info),
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_allocators_sentence_and_drops_the_backtrace() {
        let cuda = "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 3.12 GiB is free.\nException raised from malloc at /pytorch/c10/cuda/CUDACachingAllocator.cpp:1234 (most recent call first):\nframe #0: c10::Error::Error\")";
        assert_eq!(
            out_of_memory_message(cuda).unwrap(),
            "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 3.12 GiB is free."
        );
        let cpu = "Torch(\"[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 8796093022208 bytes. Error code 12 (Cannot allocate memory)\")";
        assert!(out_of_memory_message(cpu).unwrap().starts_with(
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8796093022208 bytes"
        ));
        assert_eq!(out_of_memory_message("index out of range"), None);
    }

    #[test]
    fn a_real_cpu_allocation_failure_is_recognised() {
        let failed = std::panic::catch_unwind(|| {
            ooze_torch::tch::Tensor::empty(
                [1i64 << 50],
                (ooze_torch::tch::Kind::Float, ooze_torch::tch::Device::Cpu),
            )
        })
        .expect_err("2^52 bytes cannot be allocated");
        let text = failed.downcast_ref::<String>().cloned().unwrap_or_default();
        let message =
            out_of_memory_message(&text).unwrap_or_else(|| panic!("not recognised: {text}"));
        assert!(message.contains("allocate"), "{message}");
        assert!(!message.contains("Exception raised from"), "{message}");
    }
}
