// Split-key attention (flash-decoding): the attention of decode, of the engine's paged prefill
// and of the trainer's forward under deterministic numerics, one kernel for all three so their
// outputs agree bitwise. Plain C launchers over raw pointers, as in kernels.cu; the checked,
// tensor-level entry points are in attention_ops.cpp.

#include <mma.h>

#include "attention_common.cuh"
#include "common.cuh"

namespace {

// Split-key attention, bf16: decode (one query token per row), the engine's paged prefill and
// the trainer's forward all run this one kernel, so a (query token, head) gets bitwise the same
// output whichever of them computes it and whatever else is in its batch.
//
// Keys are split into chunks [s·CHUNK, +CHUNK) at fixed positions. Block (split, kv head, tile):
// a tile is up to 16 / G consecutive query tokens of one sequence × the G query heads of one key
// head (rows token·G + g of a 16-row tensor-core tile, padded). Pass A: scores S = Q·Kᵀ into
// shared memory (each warp a 16-key tile at a time). Softmax over the chunk per row (max, exp,
// sum; keys after the row's own token masked), P rounded to bf16 in place of the row's scores.
// Pass B: O = P·V (each warp 16 output columns, the key tiles summed in order). The partial O
// (unnormalised), max and sum go out per split; a second kernel merges the splits in order. A
// row's arithmetic never depends on the other rows of its tile: tensor-core products are per row,
// and the keys a row masks add exact zeros.
//
// Keys and values reach shared memory in rounds of 8 KiB, copied 16 bytes at a time (cp.async)
// into two slots: the next round's copy is in flight while this round's products run, and the
// first round of values is fetched during the last round of scores and the softmax. Tensor-core
// loads straight from global memory (the kernel before) issue 4-byte loads, each fetching half of
// every 32-byte sector it touches; staged, H200 decode went from 16.8 to 14.8 ms per step at 4B
// and from 3.48 to 3.29 ms at 0.5B (docs/benchmarks.md).
constexpr int ATT_CHUNK = 256;
constexpr int ATT_WARPS = 4;
constexpr int ATT_PAD = 8;  // keeps shared-memory rows off the same banks, multiple of 8 (wmma)
// The scores' rows in shared memory, in floats; the bf16 probabilities reuse each row.
constexpr int ATT_S_LD = ATT_CHUNK + ATT_PAD;

struct AttentionArgs {
  const __nv_bfloat16* q;  // [tokens, ·] rows of q_stride elements, heads · D at the start
  const __nv_bfloat16* k;  // key rows of k_stride elements, kv_heads · D at the start
  const __nv_bfloat16* v;
  int64_t q_stride, k_stride, v_stride;
  KeyMap keys;
  const int* tiles;
  const int64_t* positions;  // [tokens]: a token sees the keys of positions ≤ its own
  int heads, kv_heads, splits, tokens;
  float scale;
  float* part_o;   // [tiles, kv_heads, splits, 16, D]
  float* part_ml;  // [tiles, kv_heads, splits, 16, 2]
  __nv_bfloat16* out;  // [tokens, ·] rows of out_stride elements, heads · D at the start
  int64_t out_stride;
  float* lse;  // [heads, tokens] or null
};

// Merges the splits of each (token, head) in order: out = Σ_s e^{m_s − m} O_s / Σ_s e^{m_s − m}
// l_s. Block (key head, tile), a thread per row of the tile and 4 output columns. With `lse`
// ([heads, tokens] fp32), also the log-sum-exp of the scaled scores, m + log Σ_s e^{m_s − m} l_s.
template <int D>
__global__ void split_attention_merge(AttentionArgs a) {
  dependent_wait();
  const int kv = blockIdx.x;
  const TileOf tile(a.tiles, blockIdx.y);
  const int group = a.heads / a.kv_heads;
  const int r = threadIdx.x / (D / 4), c = threadIdx.x % (D / 4) * 4;
  if (r >= tile.count * group) return;
  const int token = r / group, head = kv * group + r % group;
  const int64_t first = (static_cast<int64_t>(blockIdx.y) * a.kv_heads + kv) * a.splits;
  const float* ml = a.part_ml + (first * 16 + r) * 2;
  const float* o = a.part_o + (first * 16 + r) * D + c;
  float m = -INFINITY;
  for (int s = 0; s < a.splits; ++s) m = fmaxf(m, ml[s * 32]);
  float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
  float den = 0.f;
  for (int s = 0; s < a.splits; ++s) {
    const float ms = ml[s * 32];
    if (ms == -INFINITY) continue;
    const float w = __expf(ms - m);
    den += w * ml[s * 32 + 1];
    const float4 os = *reinterpret_cast<const float4*>(o + static_cast<int64_t>(s) * 16 * D);
    num.x += w * os.x;
    num.y += w * os.y;
    num.z += w * os.z;
    num.w += w * os.w;
  }
  const int64_t at = tile.first + token;
  __nv_bfloat16* out = a.out + at * a.out_stride + static_cast<int64_t>(head) * D + c;
  out[0] = __float2bfloat16(num.x / den);
  out[1] = __float2bfloat16(num.y / den);
  out[2] = __float2bfloat16(num.z / den);
  out[3] = __float2bfloat16(num.w / den);
  if (a.lse != nullptr && c == 0) a.lse[static_cast<int64_t>(head) * a.tokens + at] = m + logf(den);
}

// 16-key tiles per copy round, 8 KiB of keys or values (at most one per warp: pass A gives each
// warp one tile).
template <int D>
__host__ __device__ constexpr int att_round() {
  return D == 64 ? 4 : 2;
}
// Blocks a multiprocessor holds at once, as shared memory allows (≈ 38 KiB a block); the
// register cap follows from it.
template <int D>
__host__ __device__ constexpr int att_blocks_per_sm() {
  return D == 64 ? 6 : 5;
}
constexpr int ATT_STAGES = 2;  // copy slots: the next round in flight while this one is used

template <int D>
struct AttentionShared {
  __nv_bfloat16 kv[ATT_STAGES][att_round<D>() * 16][D + ATT_PAD];  // copy rounds, a ring
  float s[16][ATT_S_LD];  // scores; then each row's probabilities (bf16); then the output tile
  __nv_bfloat16 q[16][D + ATT_PAD];
  // Where each 16-key tile of the chunk starts (keys [first + 16t, +16) are one run of memory:
  // block sizes are multiples of 16).
  int64_t cell[ATT_CHUNK / 16];
  float max[16], sum[16];
};

template <int D>
__global__ void __launch_bounds__(ATT_WARPS * 32, att_blocks_per_sm<D>())
    split_attention_kernel(AttentionArgs a) {
  using namespace nvcuda;
  constexpr int ATT_ROUND = att_round<D>();
  static_assert(ATT_ROUND <= ATT_WARPS, "one tile per warp in pass A");
  constexpr int BANDS = D / 16 / ATT_WARPS;  // pass B's 16-column bands per warp
  __shared__ __align__(128) AttentionShared<D> sh;
  dependents_may_start();
  const int split = blockIdx.x, kv = blockIdx.y, tile_index = blockIdx.z;
  const TileOf tile(a.tiles, tile_index);
  const int group = a.heads / a.kv_heads;
  const int rows = tile.count * group;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t first = static_cast<int64_t>(split) * ATT_CHUNK;
  // The tile's last token sees the most keys.
  const int64_t n_keys = a.positions[tile.first + tile.count - 1] + 1;
  // Where each 16-key tile of the chunk starts, looked up for every tile inside the block table
  // before the key count is known (the two loads overlap; tiles past the keys are never copied).
  const int64_t cell =
      tid < ATT_CHUNK / 16 ? a.keys.cell_if_mapped(tile.seq, first + static_cast<int64_t>(tid) * 16)
                           : 0;
  const int valid = static_cast<int>(n_keys - first < ATT_CHUNK ? n_keys - first : ATT_CHUNK);
  const int64_t part = (static_cast<int64_t>(tile_index) * a.kv_heads + kv) * a.splits + split;
  float* out_o = a.part_o + part * 16 * D;
  float* out_ml = a.part_ml + part * 16 * 2;
  if (valid <= 0) {
    for (int r = tid; r < 16; r += blockDim.x) {
      out_ml[2 * r] = -INFINITY;
      out_ml[2 * r + 1] = 0.f;
    }
  } else {
    const int key_tiles = (valid + 15) / 16;
    const int rounds = (key_tiles + ATT_ROUND - 1) / ATT_ROUND;
    if (tid < key_tiles) sh.cell[tid] = cell;
    // The query tile, 16 bytes a piece (the launcher checks the alignment); rows past the tile's
    // are zeros.
    constexpr int Q_PIECES = 16 * D / 8 / (ATT_WARPS * 32);
#pragma unroll
    for (int j = 0; j < Q_PIECES; ++j) {
      const int p = tid + j * ATT_WARPS * 32;
      const int r = p / (D / 8), d = p % (D / 8) * 8;
      *reinterpret_cast<uint4*>(&sh.q[r][d]) =
          r < rows ? *reinterpret_cast<const uint4*>(
                         a.q + static_cast<int64_t>(tile.first + r / group) * a.q_stride +
                         (kv * group + r % group) * D + d)
                   : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
    // Copies round i (the keys' rounds 0..rounds-1, then the values') into its ring slot, as one
    // commit group; past the last round, an empty group (the wait below counts groups).
    auto stage = [&](int i) {
      if (i < 2 * rounds) {
        const bool values = i >= rounds;
        const int round = values ? i - rounds : i;
        const __nv_bfloat16* from = values ? a.v : a.k;
        const int64_t stride = values ? a.v_stride : a.k_stride;
        const __nv_bfloat16* head = from + static_cast<int64_t>(kv) * D;
        constexpr int PIECES = 16 * D / 8;  // 16-byte pieces of one 16-key tile
#pragma unroll
        for (int j = 0; j < ATT_ROUND * PIECES / (ATT_WARPS * 32); ++j) {
          const int p = tid + j * ATT_WARPS * 32;
          const int within = p / PIECES, key = p % PIECES / (D / 8), piece = p % (D / 8);
          const int t = round * ATT_ROUND + within;
          if (t < key_tiles) {
            copy_async_16(&sh.kv[i % ATT_STAGES][within * 16 + key][piece * 8],
                          head + (sh.cell[t] + key) * stride + piece * 8);
          }
        }
      }
      copy_async_commit();
    };
    __nv_bfloat16* s_p = reinterpret_cast<__nv_bfloat16*>(&sh.s[0][0]);
    constexpr int P_LD = 2 * ATT_S_LD;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> out_acc[BANDS];
#pragma unroll
    for (int b = 0; b < BANDS; ++b) wmma::fill_fragment(out_acc[b], 0.f);
#pragma unroll
    for (int i = 0; i < ATT_STAGES - 1; ++i) stage(i);
    for (int i = 0; i < 2 * rounds; ++i) {
      // Round i has landed (ATT_STAGES − 2 later groups may still be in flight), for every
      // thread; and every warp is done with round i − 1, whose slot the next copy reuses.
      copy_async_wait<ATT_STAGES - 2>();
      __syncthreads();
      stage(i + ATT_STAGES - 1);
      const __nv_bfloat16(*slot)[D + ATT_PAD] = sh.kv[i % ATT_STAGES];
      if (i < rounds) {
        // Pass A: this warp's key tile of the round.
        const int t = i * ATT_ROUND + warp;
        if (warp < ATT_ROUND && t < key_tiles) {
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
          wmma::fill_fragment(acc, 0.f);
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb;
            wmma::load_matrix_sync(qa, &sh.q[0][kk * 16], D + ATT_PAD);
            wmma::load_matrix_sync(kb, &slot[warp * 16][kk * 16], D + ATT_PAD);
            wmma::mma_sync(acc, qa, kb, acc);
          }
          wmma::store_matrix_sync(&sh.s[0][t * 16], acc, ATT_S_LD, wmma::mem_row_major);
        }
        if (i == rounds - 1) {
          __syncthreads();
          // Softmax over the chunk, one warp per row; a row sees keys up to its own token's
          // position. The row's scores are read whole before its probabilities overwrite them.
          // Rows past the tile's, and rows that see none of the chunk's keys, are skipped: their
          // probabilities reach only output rows that are never read (rows past the tile's are
          // not written out, and the merge skips a split whose max is −∞).
          for (int r = warp; r < rows; r += ATT_WARPS) {
            // How many of the chunk's keys the row sees: in decode (one token a tile) all of them.
            int row_valid = valid;
            if (tile.count > 1) {
              const int64_t own = a.positions[tile.first + r / group] + 1 - first;
              row_valid = static_cast<int>(own < ATT_CHUNK ? own : ATT_CHUNK);
            }
            if (row_valid <= 0) {
              if (lane == 0) {
                sh.max[r] = -INFINITY;
                sh.sum[r] = 0.f;
              }
              continue;
            }
            float x[ATT_CHUNK / 32];
#pragma unroll
            for (int j = 0; j < ATT_CHUNK / 32; ++j) x[j] = sh.s[r][lane + 32 * j];
            __syncwarp();
            __nv_bfloat16* p = s_p + r * P_LD;
            float m = -INFINITY;
#pragma unroll
            for (int j = 0; j < ATT_CHUNK / 32; ++j) {
              if (lane + 32 * j < row_valid) m = fmaxf(m, x[j] * a.scale);
            }
            for (int offset = 16; offset > 0; offset >>= 1) {
              m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
            }
            float l = 0.f;
#pragma unroll
            for (int j = 0; j < ATT_CHUNK / 32; ++j) {
              const int at = lane + 32 * j;
              if (at >= key_tiles * 16) break;
              const float e = at < row_valid ? __expf(x[j] * a.scale - m) : 0.f;
              l += e;
              p[at] = __float2bfloat16(e);
            }
            l = warp_sum(l);
            if (lane == 0) {
              sh.max[r] = m;
              sh.sum[r] = l;
            }
          }
        }
      } else {
        // Pass B: this warp's column bands over the round's key tiles, in key order.
        const int round = i - rounds;
#pragma unroll
        for (int w = 0; w < ATT_ROUND; ++w) {
          const int t = round * ATT_ROUND + w;
          if (t >= key_tiles) break;
          wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
          wmma::load_matrix_sync(pa, s_p + t * 16, P_LD);
#pragma unroll
          for (int b = 0; b < BANDS; ++b) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
            wmma::load_matrix_sync(vb, &slot[w * 16][(warp + b * ATT_WARPS) * 16], D + ATT_PAD);
            wmma::mma_sync(out_acc[b], pa, vb, out_acc[b]);
          }
        }
      }
    }
    // The output tile goes through shared memory (the probabilities are done with) so that
    // only the tile's own rows are written out.
    __syncthreads();
    float* s_o = &sh.s[0][0];
#pragma unroll
    for (int b = 0; b < BANDS; ++b) {
      wmma::store_matrix_sync(s_o + (warp + b * ATT_WARPS) * 16, out_acc[b], D, wmma::mem_row_major);
    }
    __syncthreads();
    for (int i = tid; i < rows * D / 4; i += blockDim.x) {
      reinterpret_cast<float4*>(out_o)[i] = reinterpret_cast<const float4*>(s_o)[i];
    }
    for (int r = tid; r < 16; r += blockDim.x) {
      out_ml[2 * r] = r < rows ? sh.max[r] : -INFINITY;
      out_ml[2 * r + 1] = r < rows ? sh.sum[r] : 0.f;
    }
  }
}

// Whether the current device launches programmatic dependents (compute capability 9.0 on).
bool att_dependent_launch() {
  static int major[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return false;
  if (major[device] == 0 &&
      cudaDeviceGetAttribute(&major[device], cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return false;
  }
  return major[device] >= 9;
}

template <int D>
int launch_split_attention(const AttentionArgs& args, int tiles, cudaStream_t stream) {
  split_attention_kernel<D><<<dim3(args.splits, args.kv_heads, tiles), ATT_WARPS * 32, 0, stream>>>(
      args);
  // The merge's blocks (a thread per row and 4 columns; decode tiles have `group` rows, others
  // up to 16) are launched as programmatic dependents on Hopper: they are placed while the last
  // attention blocks run and wait there for their results.
  const int group = args.heads / args.kv_heads;
  const int rows = args.tiles == nullptr ? group : 16;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(args.kv_heads, tiles);
  config.blockDim = dim3(rows * D / 4);
  config.stream = stream;
  cudaLaunchAttribute early[1];
  early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early[0].val.programmaticStreamSerializationAllowed = 1;
  if (att_dependent_launch()) {
    config.attrs = early;
    config.numAttrs = 1;
  }
  const cudaError_t e = cudaLaunchKernelEx(&config, split_attention_merge<D>, args);
  if (e != cudaSuccess) return static_cast<int>(e);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" {

int ooze_attention_splits(int read_len) { return (read_len + ATT_CHUNK - 1) / ATT_CHUNK; }

// See split_attention_kernel. q/k/v_stride: elements between consecutive tokens' (keys')
// rows. table/width/block_size: KeyMap. tiles: int32 [tiles, 3] or null (decode: tile i is token
// i of sequence i). part_o / part_ml: room for the partials ([tiles, kv_heads, splits, 16, dim]
// and [.., 2] fp32). out [tokens, ·] rows of out_stride
// elements; lse [heads, tokens] or null.
int ooze_launch_split_attention(const void* q, int64_t q_stride, const void* k, int64_t k_stride,
                                const void* v, int64_t v_stride, const int64_t* table, int width,
                                int64_t block_size, const int* tiles, int n_tiles, int tokens,
                                const int64_t* positions, int heads, int kv_heads, int dim,
                                int splits, float scale, float* part_o, float* part_ml, void* out,
                                int64_t out_stride, float* lse, cudaStream_t stream) {
  AttentionArgs args{static_cast<const __nv_bfloat16*>(q),
                     static_cast<const __nv_bfloat16*>(k),
                     static_cast<const __nv_bfloat16*>(v),
                     q_stride,
                     k_stride,
                     v_stride,
                     KeyMap{table, width, block_size},
                     tiles,
                     positions,
                     heads,
                     kv_heads,
                     splits,
                     tokens,
                     scale,
                     part_o,
                     part_ml,
                     static_cast<__nv_bfloat16*>(out),
                     out_stride,
                     lse};
  // The query tile is loaded 16 bytes at a time.
  if (reinterpret_cast<uintptr_t>(q) % 16 != 0 || q_stride % 8 != 0) {
    return static_cast<int>(cudaErrorMisalignedAddress);
  }
  if (dim == 64) return launch_split_attention<64>(args, n_tiles, stream);
  if (dim == 128) return launch_split_attention<128>(args, n_tiles, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // extern "C"
