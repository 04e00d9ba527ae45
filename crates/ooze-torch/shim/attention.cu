// Split-key attention (flash-decoding): the attention of decode, of the engine's paged prefill
// and of the trainer's forward under deterministic numerics, one kernel for all three so their
// outputs agree bitwise. Plain C launchers over raw pointers, as in kernels.cu; the checked,
// tensor-level entry points are in attention_ops.cpp.

#include <mma.h>

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
// sum; keys after the row's own token masked), P rounded to bf16. Pass B: O = P·V (each warp 16
// output columns). The partial O (unnormalised), max and sum go out per split; a second kernel
// merges the splits in order. A row's arithmetic never depends on the other rows of its tile:
// tensor-core products are per row, and the keys a row masks add exact zeros.
constexpr int ATT_CHUNK = 256;
constexpr int ATT_WARPS = 4;
constexpr int ATT_PAD = 8;  // keeps shared-memory rows off the same banks, multiple of 8 (wmma)

// Where the keys and values of a sequence live. Paged (block_size > 0): position p of sequence s
// is cell table[s · width + p / block_size] · block_size + p % block_size. Contiguous
// (block_size == 0): row table[s] + p.
struct KeyMap {
  const int64_t* table;
  int width;
  int64_t block_size;
  __device__ __forceinline__ int64_t cell(int seq, int64_t p) const {
    if (block_size == 0) return table[seq] + p;
    return table[static_cast<int64_t>(seq) * width + p / block_size] * block_size + p % block_size;
  }
};

// A tile's tokens: `tiles` is int32 [tiles, 3] (first token, token count, sequence), or null for
// decode (tile i is token i alone, of sequence i).
struct TileOf {
  int first, count, seq;
  __device__ __forceinline__ TileOf(const int* tiles, int tile) {
    if (tiles == nullptr) {
      first = tile, count = 1, seq = tile;
    } else {
      first = tiles[3 * tile], count = tiles[3 * tile + 1], seq = tiles[3 * tile + 2];
    }
  }
};

struct AttentionArgs {
  const __nv_bfloat16* q;  // [tokens, ·] rows of q_stride elements, heads · D at the start
  const __nv_bfloat16* k;  // key rows of k_stride elements, kv_heads · D at the start
  const __nv_bfloat16* v;
  int64_t q_stride, k_stride, v_stride;
  KeyMap keys;
  const int* tiles;
  const int64_t* positions;  // [tokens]: a token sees the keys of positions ≤ its own
  int heads, kv_heads, splits;
  float scale;
  float* part_o;   // [tiles, kv_heads, splits, 16, D]
  float* part_ml;  // [tiles, kv_heads, splits, 16, 2]
};

template <int D>
__global__ void __launch_bounds__(ATT_WARPS * 32) split_attention_kernel(AttentionArgs a) {
  using namespace nvcuda;
  const int split = blockIdx.x, kv = blockIdx.y, tile_index = blockIdx.z;
  const TileOf tile(a.tiles, tile_index);
  const int group = a.heads / a.kv_heads;
  const int rows = tile.count * group;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t first = static_cast<int64_t>(split) * ATT_CHUNK;
  // The tile's last token sees the most keys.
  const int64_t n_keys = a.positions[tile.first + tile.count - 1] + 1;
  const int valid = static_cast<int>(n_keys - first < ATT_CHUNK ? n_keys - first : ATT_CHUNK);
  const int64_t part = (static_cast<int64_t>(tile_index) * a.kv_heads + kv) * a.splits + split;
  float* out_o = a.part_o + part * 16 * D;
  float* out_ml = a.part_ml + part * 16 * 2;
  if (valid <= 0) {
    for (int r = tid; r < 16; r += blockDim.x) {
      out_ml[2 * r] = -INFINITY;
      out_ml[2 * r + 1] = 0.f;
    }
    return;
  }
  __shared__ __align__(32) __nv_bfloat16 s_q[16][D + ATT_PAD];
  __shared__ __align__(32) float s_s[16][ATT_CHUNK + ATT_PAD];
  __shared__ __align__(32) __nv_bfloat16 s_p[16][ATT_CHUNK + ATT_PAD];
  // Where each 16-key tile of the chunk starts (keys [first + 16t, +16) are one run of memory:
  // block sizes are multiples of 16), looked up once, up front.
  __shared__ int64_t s_cell[ATT_CHUNK / 16];
  for (int i = tid; i < 16 * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    s_q[r][d] = r < rows ? a.q[static_cast<int64_t>(tile.first + r / group) * a.q_stride +
                               (kv * group + r % group) * D + d]
                         : __float2bfloat16(0.f);
  }
  const int key_tiles = (valid + 15) / 16;
  for (int t = tid; t < key_tiles; t += blockDim.x) {
    s_cell[t] = a.keys.cell(tile.seq, first + static_cast<int64_t>(t) * 16);
  }
  __syncthreads();
  for (int t = warp; t < key_tiles; t += ATT_WARPS) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
    const __nv_bfloat16* k = a.k + s_cell[t] * a.k_stride + static_cast<int64_t>(kv) * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb;
      wmma::load_matrix_sync(qa, &s_q[0][kk * 16], D + ATT_PAD);
      wmma::load_matrix_sync(kb, k + kk * 16, static_cast<unsigned>(a.k_stride));
      wmma::mma_sync(acc, qa, kb, acc);
    }
    wmma::store_matrix_sync(&s_s[0][t * 16], acc, ATT_CHUNK + ATT_PAD, wmma::mem_row_major);
  }
  __syncthreads();
  // Softmax over the chunk, one warp per row; a row sees keys up to its own token's position.
  __shared__ float s_max[16], s_sum[16];
  for (int r = warp; r < 16; r += ATT_WARPS) {
    const int64_t own = r < rows ? a.positions[tile.first + r / group] + 1 - first : 0;
    const int row_valid = static_cast<int>(own < ATT_CHUNK ? own : ATT_CHUNK);
    if (row_valid <= 0) {
      for (int j = lane; j < key_tiles * 16; j += 32) s_p[r][j] = __float2bfloat16(0.f);
      if (lane == 0) {
        s_max[r] = -INFINITY;
        s_sum[r] = 0.f;
      }
      continue;
    }
    float m = -INFINITY;
    for (int j = lane; j < row_valid; j += 32) m = fmaxf(m, s_s[r][j] * a.scale);
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float l = 0.f;
    for (int j = lane; j < key_tiles * 16; j += 32) {
      const float p = j < row_valid ? __expf(s_s[r][j] * a.scale - m) : 0.f;
      l += p;
      s_p[r][j] = __float2bfloat16(p);
    }
    l = warp_sum(l);
    if (lane == 0) {
      s_max[r] = m;
      s_sum[r] = l;
    }
  }
  __syncthreads();
  // O = P·V, each warp 16 output columns at a time.
  for (int n = warp; n < D / 16; n += ATT_WARPS) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
    for (int t = 0; t < key_tiles; ++t) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
      wmma::load_matrix_sync(pa, &s_p[0][t * 16], ATT_CHUNK + ATT_PAD);
      wmma::load_matrix_sync(vb, a.v + s_cell[t] * a.v_stride + static_cast<int64_t>(kv) * D + n * 16,
                             static_cast<unsigned>(a.v_stride));
      wmma::mma_sync(acc, pa, vb, acc);
    }
    wmma::store_matrix_sync(out_o + n * 16, acc, D, wmma::mem_row_major);
  }
  for (int r = tid; r < 16; r += blockDim.x) {
    out_ml[2 * r] = r < rows ? s_max[r] : -INFINITY;
    out_ml[2 * r + 1] = r < rows ? s_sum[r] : 0.f;
  }
}

// Merges the splits of each (token, head) in order: out = Σ_s e^{m_s − m} O_s / Σ_s e^{m_s − m}
// l_s. Block (head, tile), a thread per output column. With `lse` ([heads, tokens] fp32), also
// the log-sum-exp of the scaled scores, m + log Σ_s e^{m_s − m} l_s.
template <int D>
__global__ void split_attention_merge(const float* __restrict__ part_o,
                                      const float* __restrict__ part_ml, const int* tiles,
                                      int tokens, int heads, int kv_heads, int splits,
                                      __nv_bfloat16* __restrict__ out, int64_t out_stride,
                                      float* __restrict__ lse) {
  const int head = blockIdx.x, d = threadIdx.x;
  const TileOf tile(tiles, blockIdx.y);
  const int group = heads / kv_heads;
  const int kv = head / group, g = head % group;
  const int64_t first = (static_cast<int64_t>(blockIdx.y) * kv_heads + kv) * splits;
  for (int token = 0; token < tile.count; ++token) {
    const int r = token * group + g;
    float m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = fmaxf(m, part_ml[((first + s) * 16 + r) * 2]);
    float num = 0.f, den = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float ms = part_ml[((first + s) * 16 + r) * 2];
      if (ms == -INFINITY) continue;
      const float w = __expf(ms - m);
      den += w * part_ml[((first + s) * 16 + r) * 2 + 1];
      num += w * part_o[((first + s) * 16 + r) * D + d];
    }
    const int64_t at = tile.first + token;
    out[at * out_stride + static_cast<int64_t>(head) * D + d] = __float2bfloat16(num / den);
    if (lse != nullptr && d == 0) lse[static_cast<int64_t>(head) * tokens + at] = m + logf(den);
  }
}

template <int D>
int launch_split_attention(const AttentionArgs& args, int tiles, int tokens, void* out,
                           int64_t out_stride, float* lse, cudaStream_t stream) {
  split_attention_kernel<D><<<dim3(args.splits, args.kv_heads, tiles), ATT_WARPS * 32, 0, stream>>>(
      args);
  split_attention_merge<D><<<dim3(args.heads, tiles), D, 0, stream>>>(
      args.part_o, args.part_ml, args.tiles, tokens, args.heads, args.kv_heads, args.splits,
      static_cast<__nv_bfloat16*>(out), out_stride, lse);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" {

int ooze_attention_splits(int read_len) { return (read_len + ATT_CHUNK - 1) / ATT_CHUNK; }

// See split_attention_kernel. q/k/v_stride: elements between consecutive tokens' (keys')
// rows. table/width/block_size: KeyMap. tiles: int32 [tiles, 3] or null (decode: tile i is token
// i of sequence i). out [tokens, ·] rows of out_stride elements; lse [heads, tokens] or null.
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
                     scale,
                     part_o,
                     part_ml};
  if (dim == 64) return launch_split_attention<64>(args, n_tiles, tokens, out, out_stride, lse, stream);
  if (dim == 128) return launch_split_attention<128>(args, n_tiles, tokens, out, out_stride, lse, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // extern "C"
