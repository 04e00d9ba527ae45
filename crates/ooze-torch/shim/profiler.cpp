// PyTorch's profiler (Kineto over CUPTI) for ooze's own programs: what `torch.profiler` gives a
// Python user, a Chrome trace of the CPU operations and every GPU kernel, copy and fill with their
// times. Part of ooze's C++ shim (built with cuda_graph.cpp); errors as there.

#include <torch/csrc/autograd/profiler_kineto.h>

#include <exception>
#include <memory>
#include <set>
#include <string>

namespace {
thread_local std::string profiler_error;
}

extern "C" {

const char* ooze_profiler_last_error() { return profiler_error.c_str(); }

// Starts recording CPU operations and, with `cuda`, GPU activity on this thread's process.
int ooze_profiler_start(int cuda) {
  try {
    namespace prof = torch::autograd::profiler;
    using torch::profiler::impl::ActivityType;
    using torch::profiler::impl::ProfilerConfig;
    using torch::profiler::impl::ProfilerState;
    const ProfilerConfig config(ProfilerState::KINETO);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (cuda) activities.insert(ActivityType::CUDA);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    return 0;
  } catch (const std::exception& e) {
    profiler_error = e.what();
    return 1;
  }
}

// Stops recording and writes the Chrome trace (JSON) to `path`.
int ooze_profiler_stop(const char* path) {
  try {
    auto result = torch::autograd::profiler::disableProfiler();
    result->save(path);
    return 0;
  } catch (const std::exception& e) {
    profiler_error = e.what();
    return 1;
  }
}

}  // extern "C"
