// Times builds of split attention (crates/ooze-torch/shim/attention.cu) against each other on the
// decode and training shapes of Qwen2.5-0.5B, Qwen3-4B and Qwen2.5-7B, and checks that every
// build's output equals the first build's bitwise. Built by run.sh, which compiles each build's
// attention.cu with its entry point renamed and lists them in builds.h (BUILD_DECLS, BUILD_LIST).
//
// Keys and values are random bf16 in paged memory (blocks of 16 keys behind a shuffled block
// table) or packed rows (training), four layers of them so that the L2 holds none between calls.
// Each build's calls are timed eager and captured in one CUDA graph (as the engine runs decode);
// the median of five runs of 40 calls. GB/s counts the keys and values read.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

typedef int (*Launch)(const void*, int64_t, const void*, int64_t, const void*, int64_t,
                      const int64_t*, int, int64_t, const int*, int, int, const int64_t*, int, int,
                      int, int, float, float*, float*, void*, int64_t, float*, cudaStream_t);
#define DECLARE_BUILD(name)                                                                     \
  extern "C" int name(const void*, int64_t, const void*, int64_t, const void*, int64_t,         \
                      const int64_t*, int, int64_t, const int*, int, int, const int64_t*, int, \
                      int, int, int, float, float*, float*, void*, int64_t, float*,            \
                      cudaStream_t);
BUILD_DECLS

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e = (x);                                                                \
    if (e != cudaSuccess) {                                                             \
      fprintf(stderr, "%s failed at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

__global__ void fill_random(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 4.f);
  }
}

__global__ void read_all(const uint4* p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
  }
  // Median of five runs of `run`, in µs per call of `calls` calls.
  template <typename F>
  float median_us(F run, int calls, cudaStream_t stream = 0) {
    std::vector<float> t;
    for (int rep = 0; rep < 5; ++rep) {
      CHECK(cudaEventRecord(start, stream));
      run();
      CHECK(cudaEventRecord(stop, stream));
      CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      t.push_back(ms * 1e3f / calls);
    }
    std::sort(t.begin(), t.end());
    return t[2];
  }
};

struct Shape {
  const char* name;
  int rows, kv_heads, group, dim, min_keys, max_keys;
  bool training;  // packed sequences, query tiles of 16 / group tokens; else one decode row each
};

const Shape SHAPES[] = {
    {"0.5B decode 256x540", 256, 2, 7, 64, 540, 540, false},
    {"0.5B decode 256x768", 256, 2, 7, 64, 768, 768, false},
    {"0.5B decode 256x1024", 256, 2, 7, 64, 1024, 1024, false},
    {"4B decode 128x1060", 128, 8, 4, 128, 1060, 1060, false},
    {"4B decode 128x1536", 128, 8, 4, 128, 1536, 1536, false},
    {"4B decode 128x2048", 128, 8, 4, 128, 2048, 2048, false},
    {"7B decode 64x1536", 64, 4, 7, 128, 1536, 1536, false},
    {"4B decode 128 mixed 100-4000", 128, 8, 4, 128, 100, 4000, false},
    {"0.5B decode 1x520", 1, 2, 7, 64, 520, 520, false},
    {"4B decode 1x1040", 1, 8, 4, 128, 1040, 1040, false},
    {"0.5B train 8x2048", 8, 2, 7, 64, 2048, 2048, true},
    {"4B train 4x4096", 4, 8, 4, 128, 4096, 4096, true},
};
constexpr int LAYERS = 4;
constexpr int CALLS = 40;

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : nullptr;
  struct Build {
    const char* name;
    Launch launch;
  };
  const std::vector<Build> builds = {BUILD_LIST};
  Timer timer;
  {
    const size_t bytes = 1ull << 30;
    void *x, *y;
    unsigned* sink;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMalloc(&sink, 4));
    const float copy_us = timer.median_us(
        [&] { for (int i = 0; i < 10; ++i) CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice)); }, 10);
    const float read_us = timer.median_us(
        [&] { for (int i = 0; i < 10; ++i) read_all<<<132 * 8, 512>>>((const uint4*)x, bytes / 16, sink); }, 10);
    printf("copy bandwidth (read + write) %.0f GB/s, read bandwidth %.0f GB/s\n",
           2.0 * bytes / copy_us / 1e3, 1.0 * bytes / read_us / 1e3);
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(sink));
  }
  for (const Shape& s : SHAPES) {
    if (only && !strstr(s.name, only)) continue;
    std::mt19937 rng(7);
    std::vector<int> keys(s.rows);
    for (int& n : keys) n = s.min_keys + (s.max_keys > s.min_keys ? rng() % (s.max_keys - s.min_keys + 1) : 0);
    const int longest = *std::max_element(keys.begin(), keys.end());
    const int heads = s.kv_heads * s.group, dim = s.dim;
    std::vector<int64_t> table, positions;
    std::vector<int> tiles;
    int width = 1, tokens = 0, n_tiles = 0;
    int64_t block_size = 0, key_rows = 0;
    double bytes = 0;  // keys and values read: each key head's keys once per query tile
    if (!s.training) {
      block_size = 16;
      width = (longest + 15) / 16;
      const int64_t blocks = (int64_t)s.rows * width;
      for (int64_t i = 0; i < blocks; ++i) table.push_back(i);
      std::shuffle(table.begin(), table.end(), rng);
      key_rows = blocks * 16;
      tokens = n_tiles = s.rows;
      for (int n : keys) {
        positions.push_back(n - 1);
        bytes += 4.0 * n * s.kv_heads * dim;
      }
    } else {
      const int per_tile = std::max(16 / s.group, 1);
      for (int seq = 0; seq < s.rows; ++seq) {
        table.push_back(tokens);
        for (int t = 0; t < keys[seq]; ++t) positions.push_back(t);
        for (int t = 0; t < keys[seq]; t += per_tile) {
          const int count = std::min(per_tile, keys[seq] - t);
          tiles.insert(tiles.end(), {tokens + t, count, seq});
          bytes += 4.0 * (t + count) * s.kv_heads * dim;
        }
        tokens += keys[seq];
      }
      key_rows = tokens + 16;  // a 16-key tile may run past the last sequence's end
      n_tiles = (int)tiles.size() / 3;
    }
    const int splits = (longest + 255) / 256;
    const size_t kv_elems = (size_t)key_rows * s.kv_heads * dim, q_elems = (size_t)tokens * heads * dim;
    std::vector<__nv_bfloat16*> k(LAYERS), v(LAYERS);
    for (int l = 0; l < LAYERS; ++l) {
      CHECK(cudaMalloc(&k[l], kv_elems * 2));
      CHECK(cudaMalloc(&v[l], kv_elems * 2));
      fill_random<<<1024, 256>>>(k[l], kv_elems, 11 + l);
      fill_random<<<1024, 256>>>(v[l], kv_elems, 101 + l);
    }
    __nv_bfloat16 *q, *out;
    int64_t *d_table, *d_positions;
    int* d_tiles = nullptr;
    float *part_o, *part_ml, *lse;
    CHECK(cudaMalloc(&q, q_elems * 2));
    CHECK(cudaMalloc(&out, q_elems * 2));
    fill_random<<<1024, 256>>>(q, q_elems, 5);
    CHECK(cudaMalloc(&d_table, table.size() * 8));
    CHECK(cudaMemcpy(d_table, table.data(), table.size() * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&d_positions, positions.size() * 8));
    CHECK(cudaMemcpy(d_positions, positions.data(), positions.size() * 8, cudaMemcpyHostToDevice));
    if (s.training) {
      CHECK(cudaMalloc(&d_tiles, tiles.size() * 4));
      CHECK(cudaMemcpy(d_tiles, tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice));
    }
    const size_t parts = (size_t)n_tiles * s.kv_heads * splits * 16;
    CHECK(cudaMalloc(&part_o, parts * dim * 4));
    CHECK(cudaMalloc(&part_ml, parts * 2 * 4));
    CHECK(cudaMalloc(&lse, (size_t)heads * tokens * 4));
    printf("== %s: %d query tiles, %d splits, %.1f MB of keys and values read a call\n", s.name,
           n_tiles, splits, bytes / 1e6);
    std::vector<uint16_t> reference;
    for (const Build& b : builds) {
      CHECK(cudaMemset(out, 0xff, q_elems * 2));
      auto call = [&](int layer, cudaStream_t stream) {
        const int rc = b.launch(q, (int64_t)heads * dim, k[layer], (int64_t)s.kv_heads * dim,
                                v[layer], (int64_t)s.kv_heads * dim, d_table, width, block_size,
                                d_tiles, n_tiles, tokens, d_positions, heads, s.kv_heads, dim,
                                splits, 0.125f, part_o, part_ml, out, (int64_t)heads * dim,
                                s.training ? lse : nullptr, stream);
        if (rc != 0) {
          fprintf(stderr, "%s: launch failed with CUDA error %d\n", b.name, rc);
          exit(1);
        }
      };
      for (int l = 0; l < LAYERS; ++l) call(l, 0);
      const float eager = timer.median_us([&] { for (int i = 0; i < CALLS; ++i) call(i % LAYERS, 0); }, CALLS);
      // The last eager call read layer (CALLS − 1) % LAYERS; the graph's last call reads the same.
      std::vector<uint16_t> got(q_elems);
      CHECK(cudaMemcpy(got.data(), out, q_elems * 2, cudaMemcpyDeviceToHost));
      cudaStream_t stream;
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < CALLS; ++i) call(i % LAYERS, stream);
      CHECK(cudaStreamEndCapture(stream, &graph));
      CHECK(cudaGraphInstantiate(&exec, graph, 0));
      CHECK(cudaGraphLaunch(exec, stream));
      CHECK(cudaStreamSynchronize(stream));
      const float graphed = timer.median_us([&] { CHECK(cudaGraphLaunch(exec, stream)); }, CALLS, stream);
      std::vector<uint16_t> got_graph(q_elems);
      CHECK(cudaMemcpy(got_graph.data(), out, q_elems * 2, cudaMemcpyDeviceToHost));
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(graph));
      CHECK(cudaStreamDestroy(stream));
      std::string verdict;
      if (got_graph != got) verdict = "GRAPH OUTPUT DIFFERS FROM EAGER; ";
      if (reference.empty()) {
        reference = got;
        verdict += "reference";
      } else {
        size_t differ = 0;
        for (size_t i = 0; i < q_elems; ++i) differ += got[i] != reference[i];
        verdict += differ == 0 ? "bitwise equal" : std::to_string(differ) + " elements differ";
      }
      printf("  %-10s eager %9.1f us  graph %9.1f us  %6.0f GB/s (graph)  %s\n", b.name, eager,
             graphed, bytes / graphed / 1e3, verdict.c_str());
    }
    for (int l = 0; l < LAYERS; ++l) {
      CHECK(cudaFree(k[l]));
      CHECK(cudaFree(v[l]));
    }
    for (void* p : {(void*)q, (void*)out, (void*)d_table, (void*)d_positions, (void*)d_tiles,
                    (void*)part_o, (void*)part_ml, (void*)lse}) {
      if (p) CHECK(cudaFree(p));
    }
  }
  return 0;
}
