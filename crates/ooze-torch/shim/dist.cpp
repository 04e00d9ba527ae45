// PyTorch's own collectives for ooze's ranks: a c10d TCPStore for the rendezvous and c10d's
// ProcessGroupGloo (CPU tensors) or ProcessGroupNCCL (CUDA tensors, when built with OOZE_NCCL),
// used through c10d's Backend interface. tch binds none of this.
//
// Every entry point returns 0 (or a non-null handle), or 1 (null) with the error in
// ooze_dist_last_error(): c10d reports a peer that died, a timeout or a bad tensor by throwing,
// and nothing may cross the C boundary as an exception.

#define USE_C10D_GLOO 1
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef OOZE_NCCL
#define USE_C10D_NCCL 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace {
thread_local std::string last_error;

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  std::chrono::milliseconds timeout;
  bool gloo;
};

// Starting a collective on a Gloo group records it in c10d's flight recorder, one per process for
// every Gloo group in it (FlightRecorder<c10::Event>, on by default). Its record call adds the
// group to a std::map on the group's first collective before it takes its own lock (PyTorch
// 2.11, FlightRecorderDetail.hpp): two groups of one process starting collectives on two threads
// at once (ranks as threads, a weight group beside another group) insert into or read that map
// while the other rebalances it, and the process crashes in std::_Rb_tree_insert_and_rebalance.
// So collectives on Gloo groups start one at a time in a process. Starting one only queues it
// for the group's worker threads (it never waits for a peer); the wait is outside this lock.
// (NCCL's recorder has the same map, but starting an NCCL collective can wait for the peers, as
// the first one creates the communicator, so NCCL groups do not take it.)
std::mutex gloo_start_mutex;

template <typename F>
c10::intrusive_ptr<c10d::Work> start(const Group& g, F f) {
  if (!g.gloo) {
    return f();
  }
  std::lock_guard<std::mutex> lock(gloo_start_mutex);
  return f();
}

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 1:
      return c10d::ReduceOp::MAX;
    case 2:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::SUM;
  }
}

// Waits for `work` within the group's timeout; a collective that did not finish is an error.
void finish(const Group& g, const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  if (!work->wait(g.timeout)) {
    throw std::runtime_error(std::string(what) + " did not finish within the timeout");
  }
}

template <typename F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}
}  // namespace

extern "C" {

const char* ooze_dist_last_error() { return last_error.c_str(); }

// Joins the group `world` ranks form through the store at host:port. `agent_store`: the store is
// served by a launcher (torchrun's agent), so every rank is a client; otherwise rank 0 serves it.
// `backend`: 0 Gloo, 1 NCCL (each collective on its tensors' GPU). Keys live under `prefix`
// ("ooze" for ooze's ranks; "NAME/" for a group torch.distributed programs join as NAME).
void* ooze_dist_new(int backend, const char* host, int port, int rank, int world, int agent_store,
                    int64_t timeout_ms, const char* prefix) {
  Group* out = nullptr;
  guarded([&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = !agent_store && rank == 0;
    opts.numWorkers = world;
    opts.waitWorkers = false;
    opts.timeout = timeout;
    opts.multiTenant = true;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    auto store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), tcp);
    c10::intrusive_ptr<c10d::Backend> pg;
    const bool nccl = backend == 1;
    if (nccl) {
#ifdef OOZE_NCCL
      auto nccl = c10d::ProcessGroupNCCL::Options::create();
      nccl->timeout = timeout;
      pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, nccl);
#else
      throw std::runtime_error("this build of ooze has no NCCL (its PyTorch has no CUDA)");
#endif
    } else {
      auto gloo = c10d::ProcessGroupGloo::Options::create_default(timeout);
      pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo);
    }
    out = new Group{store, pg, timeout, !nccl};
  });
  return out;
}

// Ends the group's communicators (NCCL's are torn down before its destructor runs, as
// `destroy_process_group` does) and frees it.
void ooze_dist_free(void* group) {
  auto* g = static_cast<Group*>(group);
  try {
    g->backend->shutdown();
  } catch (const std::exception&) {
    // A communicator that fails to shut down is freed all the same.
  }
  delete g;
}

// In place on every rank: `op` (0 sum, 1 max, 2 min) of every rank's tensor.
int ooze_dist_all_reduce(void* group, at::Tensor* tensor, int op) {
  return guarded([&] {
    auto& g = *static_cast<Group*>(group);
    std::vector<at::Tensor> tensors{*tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduce_op(op);
    finish(g, start(g, [&] { return g.backend->allreduce(tensors, opts); }), "all-reduce");
  });
}

// In place: every rank's tensor becomes rank `root`'s.
int ooze_dist_broadcast(void* group, at::Tensor* tensor, int root) {
  return guarded([&] {
    auto& g = *static_cast<Group*>(group);
    std::vector<at::Tensor> tensors{*tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    finish(g, start(g, [&] { return g.backend->broadcast(tensors, opts); }), "broadcast");
  });
}

// `out` (world × the size of `in`, contiguous) ← every rank's `in`, in rank order.
int ooze_dist_all_gather(void* group, at::Tensor* out, at::Tensor* in) {
  return guarded([&] {
    auto& g = *static_cast<Group*>(group);
    auto gather = [&] { return g.backend->_allgather_base(*out, *in, c10d::AllgatherOptions()); };
    finish(g, start(g, gather), "all-gather");
  });
}

// `out` ← this rank's slice (in rank order) of the `op` over ranks of `in` (world × out's size).
int ooze_dist_reduce_scatter(void* group, at::Tensor* out, at::Tensor* in, int op) {
  return guarded([&] {
    auto& g = *static_cast<Group*>(group);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = reduce_op(op);
    auto scatter = [&] { return g.backend->_reduce_scatter_base(*out, *in, opts); };
    finish(g, start(g, scatter), "reduce-scatter");
  });
}

// Started collectives (prefetch): the handle of one in flight, for ooze_dist_wait; null on error.
void* ooze_dist_all_gather_start(void* group, at::Tensor* out, at::Tensor* in) {
  c10::intrusive_ptr<c10d::Work>* work = nullptr;
  guarded([&] {
    auto& g = *static_cast<Group*>(group);
    auto gather = [&] { return g.backend->_allgather_base(*out, *in, c10d::AllgatherOptions()); };
    work = new c10::intrusive_ptr<c10d::Work>(start(g, gather));
  });
  return work;
}

void* ooze_dist_reduce_scatter_start(void* group, at::Tensor* out, at::Tensor* in, int op) {
  c10::intrusive_ptr<c10d::Work>* work = nullptr;
  guarded([&] {
    auto& g = *static_cast<Group*>(group);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = reduce_op(op);
    auto scatter = [&] { return g.backend->_reduce_scatter_base(*out, *in, opts); };
    work = new c10::intrusive_ptr<c10d::Work>(start(g, scatter));
  });
  return work;
}

// Waits for a started collective and frees its handle. On GPUs (NCCL) the current stream waits
// for it and the host goes on, so compute queued before the wait overlaps the transfer; on CPUs
// (Gloo) the host waits, within the group's timeout.
int ooze_dist_wait(void* group, void* handle) {
  auto* work = static_cast<c10::intrusive_ptr<c10d::Work>*>(handle);
  int code = guarded([&] {
    auto& g = *static_cast<Group*>(group);
    if (g.backend->getBackendName() == "nccl") {
      (*work)->wait();
    } else {
      finish(g, *work, "collective");
    }
  });
  delete work;
  return code;
}

int ooze_dist_barrier(void* group) {
  return guarded([&] {
    auto& g = *static_cast<Group*>(group);
    finish(g, start(g, [&] { return g.backend->barrier(c10d::BarrierOptions()); }), "barrier");
  });
}

}  // extern "C"
