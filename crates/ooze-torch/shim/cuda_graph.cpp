// ooze's C++ shim: what tch does not bind. Compiled by build.rs against the libtorch headers of the
// PyTorch that tch links (and CUDA's host headers from the nvidia wheels), only when that PyTorch
// has CUDA. Every entry point catches C++ exceptions and reports them through ooze_shim_last_error.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <exception>
#include <memory>
#include <optional>
#include <string>

namespace {
thread_local std::string last_error;
}

struct OozeGraph {
  at::cuda::CUDAGraph graph;
  // Capture runs on a side stream (capturing the default stream is not allowed); the guard makes
  // it current between capture_begin and capture_end.
  std::optional<c10::cuda::CUDAStreamGuard> guard;
};

extern "C" {

const char* ooze_shim_last_error() { return last_error.c_str(); }

OozeGraph* ooze_graph_new() {
  try {
    return new OozeGraph();
  } catch (const std::exception& e) {
    last_error = e.what();
    return nullptr;
  }
}

// `share` (may be null): an earlier graph whose memory pool this one shares. Graphs sharing a pool
// must be replayed one at a time, which is how the engine uses them.
int ooze_graph_capture_begin(OozeGraph* g, int device, OozeGraph* share) {
  try {
    g->guard.emplace(c10::cuda::getStreamFromPool(false, static_cast<c10::DeviceIndex>(device)));
    at::cuda::MempoolId_t pool = share ? share->graph.pool() : at::cuda::MempoolId_t{0, 0};
    g->graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    return 0;
  } catch (const std::exception& e) {
    g->guard.reset();
    last_error = e.what();
    return 1;
  }
}

int ooze_graph_capture_end(OozeGraph* g) {
  try {
    g->graph.capture_end();
    g->guard.reset();
    return 0;
  } catch (const std::exception& e) {
    g->guard.reset();
    last_error = e.what();
    return 1;
  }
}

int ooze_graph_replay(OozeGraph* g) {
  try {
    g->graph.replay();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

void ooze_graph_free(OozeGraph* g) { delete g; }

// Waits for the calling thread's current stream on `device`. Unlike cudaDeviceSynchronize, this
// is allowed while another thread captures a graph on a stream of its own.
int ooze_stream_synchronize(int device) {
  try {
    c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).synchronize();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

// The CPU tensor `host` on CUDA device `device` (null on error), copied asynchronously on the
// current stream from pinned memory, which PyTorch's caching host allocator keeps until the copy
// has run: the call returns without waiting for the GPU. (tch's pin_memory passes a device
// argument, which PyTorch warns about on every call.)
at::Tensor* ooze_upload(const at::Tensor* host, int device) {
  try {
    const at::Device cuda(at::kCUDA, static_cast<c10::DeviceIndex>(device));
    return new at::Tensor(host->pin_memory().to(cuda, /*non_blocking=*/true));
  } catch (const std::exception& e) {
    last_error = e.what();
    return nullptr;
  }
}

// An event recorded on the calling thread's current stream of `device` (null on error): it passes
// once the work queued there so far is done.
void* ooze_event_record(int device) {
  try {
    auto event = std::make_unique<at::cuda::CUDAEvent>();
    event->record(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)));
    return event.release();
  } catch (const std::exception& e) {
    last_error = e.what();
    return nullptr;
  }
}

// Waits for `event` (and only the work before it, not what was queued after).
int ooze_event_synchronize(void* event) {
  try {
    static_cast<at::cuda::CUDAEvent*>(event)->synchronize();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

void ooze_event_free(void* event) { delete static_cast<at::cuda::CUDAEvent*>(event); }

// The most memory the caching allocator has had allocated on `device` since the last reset (-1 on
// error); with `reset`, the peak starts again from what is allocated now.
int64_t ooze_cuda_peak_allocated(int device, int reset) {
  try {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    auto peak = stats.allocated_bytes[0].peak;
    if (reset) c10::cuda::CUDACachingAllocator::resetPeakStats(device);
    return peak;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -1;
  }
}

// Drops libtorch warnings while alive (WarningHandlerGuard): switching the preferred BLAS library
// warns that the switch is experimental, which a user can do nothing about.
struct DropWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

// How cuBLAS may reduce 16-bit GEMMs (libtorch's process-wide setting, for bf16 and fp16 alike):
// 0 reduced-precision split-K (PyTorch's default), 2 no split-K (1, split-K reduced in fp32,
// is PyTorch's third option; ooze does not use it).
int ooze_set_gemm_reduction(int mode) {
  try {
    const bool reduced = mode == 0, split_k = mode != 2;
    at::globalContext().setAllowBF16ReductionCuBLAS(reduced, split_k);
    at::globalContext().setAllowFP16ReductionCuBLAS(reduced, split_k);
    // Only cuBLASLt can be told not to split.
    if (!split_k) {
      static DropWarnings drop;
      c10::WarningUtils::WarningHandlerGuard quiet(&drop);
      at::globalContext().setBlasPreferredBackend(at::BlasBackend::Cublaslt);
    }
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

}  // extern "C"
