// Attention in FlashAttention-2's order: the engine's decode attention in the default numerics,
// computing each (query token, head) with the arithmetic of the trainer's forward — PyTorch's
// FlashAttention-2, bf16, head sizes 64 and 128 — so that the two agree bitwise without the
// trainer giving up FlashAttention. Plain C launcher over raw pointers, as in attention.cu.
//
// What FlashAttention-2's forward does for one row (a query token of one head), and what this
// kernel reproduces operation for operation:
// - keys in blocks of BLOCK_N (128 at head size 64, 64 at 128) aligned at the sequence's first
//   key, visited from the last block the row sees down to the first;
// - per block, scores S = q·kᵀ on tensor cores (m16n8k16, fp32 sums from zero, head dimension in
//   steps of 16 in order); keys after the row's own position masked to −∞;
// - the running max m over the blocks so far; the previous sums and output scaled by
//   exp2((m_prev − m)·log2e·scale); P = exp2(S·(log2e·scale) − m·(log2e·scale)), the product
//   rounded before the subtraction; P rounded to bf16; O += P·V on tensor cores (16 keys a step,
//   in order, into the running fp32 output);
// - the row's sum kept as four partial sums, one per thread of a quad, each over the keys
//   8n + 2t and 8n + 2t + 1 of a block in order of n; at the end (s0 + s2) + (s1 + s3);
// - out = bf16(O · (1 / sum)).
// A row's result depends on nothing else in its tile: blocks past a row's own keys add exact
// zeros, as in FlashAttention-2's causal tiles.
//
// Block (kv head, tile), four warps; a tile is up to 16 rows (query tokens × the query heads of
// the key head), as in split attention. Keys and values arrive 64 positions at a time (the keys,
// then the values, of each block, latest block first) through three or four copy slots, all but
// one in flight while one is used; the block table is read a block ahead and each 16-key run's
// offset kept in shared memory, so that staging a copy is an add and a cp.async. Each warp
// computes the scores of 16 keys of each 64; a quad of threads per row (rows 0–7 warp 0, 8–15
// warp 1, a warp of padding rows skipping) runs the block's softmax over shared memory in
// FlashAttention-2's per-thread order; each warp then accumulates a quarter of the output
// columns. What limits it (ncu, H200): barriers and fixed-latency dependencies, not copies in
// flight (docs/benchmarks.md).

#include "attention_common.cuh"
#include "common.cuh"

namespace {

// FlashAttention-2's key block for the bf16 forward on sm80/sm90 (PyTorch's
// flash_fwd_launch_template.h: hdim 64 → 128 × 128 tiles, hdim 128 → 128 × 64).
template <int D>
__host__ __device__ constexpr int fao_block_n() {
  return D == 64 ? 128 : 64;
}
// Keys per chunk: a row with more keys is split into chunks of this many, each run by its own
// block and merged after (as split attention merges); rows of at most this many keys are
// FlashAttention-2's bitwise. Long single rows would otherwise leave most of the GPU idle.
constexpr int FAO_CHUNK = 4096;
constexpr int FAO_WARPS = 4;
// Copy slots: SLOTS − 1 items are in flight while one is used. Three slots (two in flight) fit
// the most blocks on a multiprocessor; four are used at head size 64 when a launch's blocks fit
// four to a multiprocessor (launch_fa_order_by_depth).
constexpr int FAO_PAD = 8;  // bf16 row padding: ldmatrix rows land on distinct banks
// Keys a copy slot holds: a block of 64 (head size 128) or half of one (64), so that a slot is
// 8 or 16 KiB and five or three blocks of the kernel fit on a multiprocessor.
constexpr int FAO_ITEM = 64;

// Blocks whose runs are looked up ahead of the copies: block b's first item looks up block
// b − fao_ahead, whose first copy is staged fao_ahead · 2 · (N / FAO_ITEM) − (SLOTS − 1) ≥ 1
// items later, after a barrier.
template <int D, int SLOTS>
__host__ __device__ constexpr int fao_ahead() {
  return (SLOTS + 2 * (fao_block_n<D>() / FAO_ITEM) - 1) / (2 * (fao_block_n<D>() / FAO_ITEM));
}
// Entries of the run table, a ring by block number: the fao_ahead blocks being staged and the one
// being looked up, rounded up to a power of two.
template <int D, int SLOTS>
__host__ __device__ constexpr int fao_ring() {
  return fao_ahead<D, SLOTS>() + 1 <= 4 ? 4 : 8;
}

template <int D, int SLOTS>
struct FaoShared {
  static constexpr int N = fao_block_n<D>();
  __nv_bfloat16 kv[SLOTS][FAO_ITEM][D + FAO_PAD];  // copy slots: keys or values of 64 positions
  float s[16][N + 4];                            // the block's scores
  __nv_bfloat16 p[16][N + FAO_PAD];              // its probabilities
  __nv_bfloat16 q[16][D + FAO_PAD];
  float rescale[16];  // per row: what the running output is multiplied by before this block
  float inv_sum[16];
  // Where each 16-key run of a block starts in the keys and in the values (elements from their
  // base, this block's key head included), by block number in a ring.
  int64_t run_k[fao_ring<D, SLOTS>()][N / 16];
  int64_t run_v[fao_ring<D, SLOTS>()][N / 16];
};

// Decode with the rotary step folded in (qkv non-null): each row's q, k and v are taken from the
// fused projection row instead of q, rotated with rope_store's arithmetic (cos and the sine with
// its first half negated, [rows, D]); the block that reads the row's last key writes the rotated
// key and the value into the row's cell of the paged memory before it reads any key, and every
// block rotates its own query heads. The same bits as rope_store and then this kernel, one launch
// fewer a layer.
struct FaoRope {
  const __nv_bfloat16* qkv;
  int64_t qkv_stride;
  const __nv_bfloat16* cos;
  const __nv_bfloat16* signed_sin;
  const int64_t* cells;
  __nv_bfloat16* k_cache;
  __nv_bfloat16* v_cache;
};

struct FaoArgs {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  int64_t q_stride, k_stride, v_stride;
  KeyMap keys;
  const int* tiles;
  const int64_t* positions;
  int heads, kv_heads;
  float scale_log2;  // softmax scale · log2(e), as FlashAttention-2's host code rounds it
  int chunks;
  float* part_o;   // [tiles, kv_heads, chunks, 16, D]: a multi-chunk row's unnormalised output
  float* part_ml;  // [tiles, kv_heads, chunks, 16, 2]: its max (raw score) and sum per chunk
  __nv_bfloat16* out;
  int64_t out_stride;
  FaoRope rope;
};

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
// c += a·b, m16n8k16, bf16 in, fp32 accumulate (the instruction FlashAttention-2's cute atom
// SM80_16x8x16_F32BF16BF16F32_TN issues).
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The A operand (16 rows × 16 columns from `col`) of a row-major bf16 tile in shared memory.
template <int LD>
__device__ __forceinline__ void load_a(unsigned (&a)[4], const __nv_bfloat16 (*tile)[LD], int col,
                                       int lane) {
  ldmatrix_x4(a, &tile[(lane / 8 % 2) * 8 + lane % 8][col + lane / 16 * 8]);
}

// Elements d … d + 7 (d a multiple of 8) of head `head` of projection row `row`, rotated as
// rope_store rotates them: pair i = (i, i + D/2) by cos[row][i] and signed_sin[row][i + D/2].
template <int D>
__device__ __forceinline__ uint4 fao_rotated(const FaoRope& r, int64_t row, int head, int d) {
  constexpr int HALF = D / 2;
  const int i = d < HALF ? d : d - HALF;
  const __nv_bfloat16* src = r.qkv + row * r.qkv_stride + static_cast<int64_t>(head) * D;
  const uint4 lo = *reinterpret_cast<const uint4*>(src + i);
  const uint4 hi = *reinterpret_cast<const uint4*>(src + i + HALF);
  const uint4 c = *reinterpret_cast<const uint4*>(r.cos + row * D + i);
  const uint4 sn = *reinterpret_cast<const uint4*>(r.signed_sin + row * D + i + HALF);
  const __nv_bfloat16* x1 = reinterpret_cast<const __nv_bfloat16*>(&lo);
  const __nv_bfloat16* x2 = reinterpret_cast<const __nv_bfloat16*>(&hi);
  const __nv_bfloat16* cs = reinterpret_cast<const __nv_bfloat16*>(&c);
  const __nv_bfloat16* ss = reinterpret_cast<const __nv_bfloat16*>(&sn);
  uint4 out;
  __nv_bfloat16* y = reinterpret_cast<__nv_bfloat16*>(&out);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float y1, y2;
    rotate(__bfloat162float(x1[e]), __bfloat162float(x2[e]), __bfloat162float(cs[e]),
           __bfloat162float(ss[e]), y1, y2);
    y[e] = __float2bfloat16(d < HALF ? y1 : y2);
  }
  return out;
}

#ifndef FAO_UNFUSED_EXP
#define FAO_UNFUSED_EXP 1
#endif
#ifndef FAO_RECIPROCAL
#define FAO_RECIPROCAL 0  // 0: IEEE 1/x; 1: rcp.approx.ftz
#endif

// exp2(x·scale − max_scaled) as FlashAttention-2 writes it (the product rounded on its own).
__device__ __forceinline__ float fao_exp(float x, float scale, float max_scaled) {
#if FAO_UNFUSED_EXP
  return exp2f(__fmul_rn(x, scale) - max_scaled);
#else
  return exp2f(__fmaf_rn(x, scale, -max_scaled));
#endif
}
__device__ __forceinline__ float fao_reciprocal(float x) {
#if FAO_RECIPROCAL
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
#else
  return 1.f / x;
#endif
}

// Blocks a multiprocessor holds, as shared memory allows (228 KiB, 1 KiB of it reserved per
// block; ≈ 43 KiB a block at head size 64 with three slots, 63 KiB at 128); the register cap
// follows from it.
template <int D, int SLOTS>
__host__ __device__ constexpr int fao_blocks_per_sm() {
  return static_cast<int>((228 * 1024) / (sizeof(FaoShared<D, SLOTS>) + 1024));
}

template <int D, int SLOTS>
__global__ void __launch_bounds__(FAO_WARPS * 32, fao_blocks_per_sm<D, SLOTS>())
    fa_order_attention_kernel(FaoArgs a) {
  constexpr int N = fao_block_n<D>();
  extern __shared__ __align__(128) unsigned char fao_raw[];
  FaoShared<D, SLOTS>& sh = *reinterpret_cast<FaoShared<D, SLOTS>*>(fao_raw);
  const int kv = blockIdx.x, chunk = blockIdx.z;
  const TileOf tile(a.tiles, blockIdx.y);
  const int group = a.heads / a.kv_heads;
  const int rows = tile.count * group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // The tile's last token sees the most keys. This block visits blocks last .. first of its
  // chunk, latest first.
  constexpr int CHUNK_BLOCKS = FAO_CHUNK / N;
  const int64_t n_keys = a.positions[tile.first + tile.count - 1] + 1;
  const int tile_last = static_cast<int>((n_keys - 1) / N);
  // More than one chunk: partials, then a merge. A launch sized for fewer keys than a row has
  // (chunks from a too-small read_len) reads only the first chunk's keys, as split attention
  // reads only its splits'.
  const bool split = tile_last >= CHUNK_BLOCKS && a.chunks > 1;
  const int first = chunk * CHUNK_BLOCKS;
  const int last = min(tile_last, first + CHUNK_BLOCKS - 1);
  const int64_t partial = (static_cast<int64_t>(blockIdx.y) * a.kv_heads + kv) * a.chunks + chunk;
  if (first > last) {
    // No keys in this chunk: an empty partial for the merge.
    if (split && tid < 16) {
      a.part_ml[partial * 32 + 2 * tid] = -INFINITY;
      a.part_ml[partial * 32 + 2 * tid + 1] = 0.f;
    }
    return;
  }
  // Items: the keys, then the values, of each block, FAO_ITEM positions apiece.
  constexpr int PARTS = N / FAO_ITEM;
  const int items = 2 * PARTS * (last - first + 1);

  // Where the 16-key runs of block b start (threads < N / 16), read from the block table, and
  // kept in the ring for the copies. A block's table entries are read one block before they are
  // used, so that the read's latency hides behind a block's work instead of holding up a barrier.
  constexpr int AHEAD = fao_ahead<D, SLOTS>(), RING = fao_ring<D, SLOTS>();
  auto find = [&](int b) -> int64_t {
    return b >= first && tid < N / 16
               ? a.keys.entry(tile.seq, static_cast<int64_t>(b) * N + tid * 16)
               : 0;
  };
  auto keep = [&](int b, int64_t entry) {
    if (b >= first && tid < N / 16) {
      const int64_t cell = a.keys.cell_at(entry, static_cast<int64_t>(b) * N + tid * 16);
      sh.run_k[b & (RING - 1)][tid] = cell * a.k_stride + static_cast<int64_t>(kv) * D;
      sh.run_v[b & (RING - 1)][tid] = cell * a.v_stride + static_cast<int64_t>(kv) * D;
    }
  };
  // This thread's pieces of a copy item: 16 bytes at column `column` of rows row0 + u·ROW_STEP.
  // A row's place in its 16-key run is row0, or row0 + 8 for odd u at head size 128.
  constexpr int ROW_PIECES = D / 8, ROW_STEP = FAO_WARPS * 32 / ROW_PIECES;
  constexpr int PIECES = FAO_ITEM / ROW_STEP;
  static_assert(ROW_STEP == 16 || ROW_STEP == 8, "a thread's rows tile the 16-key runs");
  const int row0 = tid / ROW_PIECES, column = tid % ROW_PIECES * 8;
  const int64_t k_in_run = row0 * a.k_stride + column, v_in_run = row0 * a.v_stride + column;
  // Item i: part i % PARTS of the keys (i / PARTS even) or values (odd) of block
  // last − i / (2·PARTS), into slot i % SLOTS; positions past the tile's keys are zeros. One
  // commit group per item (empty past the end).
  auto stage = [&](int i) {
    if (i < items) {
      const int b = last - i / (2 * PARTS);
      const bool values = i / PARTS % 2 == 1;
      const int from = i % PARTS * FAO_ITEM;
      const __nv_bfloat16* base = values ? a.v : a.k;
      const int64_t* runs = values ? sh.run_v[b & (RING - 1)] : sh.run_k[b & (RING - 1)];
      const int64_t stride = values ? a.v_stride : a.k_stride;
      const int64_t in_run = values ? v_in_run : k_in_run;
      const int64_t first_key = static_cast<int64_t>(b) * N + from;
      const bool whole = first_key + FAO_ITEM <= n_keys;
#pragma unroll
      for (int u = 0; u < PIECES; ++u) {
        const int row = row0 + u * ROW_STEP;
        __nv_bfloat16* to = &sh.kv[i % SLOTS][row][column];
        if (whole || first_key + row < n_keys) {
          const int run = from / 16 + (ROW_STEP == 16 ? u : u / 2);
          copy_async_16(to, base + runs[run] + in_run + (ROW_STEP == 16 ? 0 : u % 2 * 8 * stride));
        } else {
          *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
        }
      }
    }
    copy_async_commit();
  };

  // The runs of the first AHEAD blocks and the next one's, and the query tile (rows past the
  // tile's are zeros): every read issued before any is waited for.
  int64_t early[AHEAD];
#pragma unroll
  for (int ahead = 0; ahead < AHEAD; ++ahead) early[ahead] = find(last - ahead);
  int64_t found = find(last - AHEAD);  // block last − AHEAD's runs, kept at block last
  constexpr int Q_PIECES = 16 * D / 8 / (FAO_WARPS * 32);
  uint4 q_piece[Q_PIECES];
  const bool rope = a.rope.qkv != nullptr;
#pragma unroll
  for (int j = 0; j < Q_PIECES; ++j) {
    const int p = tid + j * FAO_WARPS * 32;
    const int r = p / (D / 8), d = p % (D / 8) * 8;
    const int64_t token = tile.first + r / group;
    const int head = kv * group + r % group;
    q_piece[j] = r >= rows ? make_uint4(0, 0, 0, 0)
                 : rope    ? fao_rotated<D>(a.rope, token, head, d)
                           : *reinterpret_cast<const uint4*>(a.q + token * a.q_stride +
                                                             static_cast<int64_t>(head) * D + d);
  }
  // The row's new key and value into its cell, by the one block that reads the row's last key
  // (or, when the launch reads fewer chunks than the row has, by its last chunk's block): written
  // before the barrier below, so that every copy staged after it sees them.
  if (rope && chunk == min(tile_last / CHUNK_BLOCKS, a.chunks - 1) && tid < 2 * (D / 8)) {
    const int d = tid % (D / 8) * 8;
    const int64_t cell = a.rope.cells[tile.first], at = static_cast<int64_t>(kv) * D + d;
    if (tid < D / 8) {
      *reinterpret_cast<uint4*>(a.rope.k_cache + cell * a.k_stride + at) =
          fao_rotated<D>(a.rope, tile.first, a.heads + kv, d);
    } else {
      *reinterpret_cast<uint4*>(a.rope.v_cache + cell * a.v_stride + at) =
          *reinterpret_cast<const uint4*>(a.rope.qkv + tile.first * a.rope.qkv_stride +
                                          static_cast<int64_t>(a.heads + a.kv_heads + kv) * D + d);
    }
  }
#pragma unroll
  for (int ahead = 0; ahead < AHEAD; ++ahead) keep(last - ahead, early[ahead]);
  __syncthreads();
  for (int i = 0; i < SLOTS - 1; ++i) stage(i);
#pragma unroll
  for (int j = 0; j < Q_PIECES; ++j) {
    const int p = tid + j * FAO_WARPS * 32;
    *reinterpret_cast<uint4*>(&sh.q[p / (D / 8)][p % (D / 8) * 8]) = q_piece[j];
  }
  __syncthreads();

  // This warp's A operands of q (all of the head dimension).
  unsigned qa[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a<D + FAO_PAD>(qa[kk], sh.q, kk * 16, lane);

  // Softmax state of the quad threads (tid < 64): row tid / 4, part tid % 4.
  const int srow = tid / 4, part = tid % 4;
  int64_t row_keys = n_keys;
  if (tid < 64 && srow < rows) row_keys = a.positions[tile.first + srow / group] + 1;
  float row_max = -INFINITY, row_sum = 0.f;

  // This warp's output columns [warp · D/4, +D/4), as m16n8 fragments.
  constexpr int OUT_TILES = D / 4 / 8;
  float acc[OUT_TILES][4] = {};
  const int g = lane / 4, t = lane % 4;

  for (int i = 0; i < items; ++i) {
    copy_async_wait<SLOTS - 2>();
    __syncthreads();
    stage(i + SLOTS - 1);
    const int b = last - i / (2 * PARTS);
    const int from = i % PARTS * FAO_ITEM;  // the item's first key within its block
    const __nv_bfloat16(*slot)[D + FAO_PAD] = sh.kv[i % SLOTS];
    if (i / PARTS % 2 == 0) {
      // The runs of block b − AHEAD: its first copy is staged after the next barrier, and the
      // ring entry this reuses belongs to a block whose copies were all staged before the one
      // above.
      if (from == 0) {
        keep(b - AHEAD, found);
        found = find(b - AHEAD - 1);
      }
      // Scores of the item's keys: 16 a warp, two 8-key tiles.
      {
        float s0[4] = {}, s1[4] = {};
        const int row0 = warp * 16, key0 = from + row0;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          unsigned kb[4];
          // Matrices: keys row0.. (cols kk·16, +8), keys row0 + 8.. (same): non-transposed rows
          // of K are the B operand's columns.
          ldmatrix_x4(kb, &slot[row0 + (lane / 16) * 8 + lane % 8][kk * 16 + (lane / 8 % 2) * 8]);
          mma_16816(s0, qa[kk], kb[0], kb[1]);
          mma_16816(s1, qa[kk], kb[2], kb[3]);
        }
        *reinterpret_cast<float2*>(&sh.s[g][key0 + 2 * t]) = make_float2(s0[0], s0[1]);
        *reinterpret_cast<float2*>(&sh.s[g + 8][key0 + 2 * t]) = make_float2(s0[2], s0[3]);
        *reinterpret_cast<float2*>(&sh.s[g][key0 + 8 + 2 * t]) = make_float2(s1[0], s1[1]);
        *reinterpret_cast<float2*>(&sh.s[g + 8][key0 + 8 + 2 * t]) = make_float2(s1[2], s1[3]);
      }
      if (from + FAO_ITEM < N) continue;  // the block's softmax waits for all of its scores
      __syncthreads();
      // Warp 0 runs rows 0–7 and warp 1 rows 8–15; a warp whose rows are all padding (decode's
      // tile is one token's G rows) skips them: the products of a padded row, whatever its
      // probabilities hold, stay in that row's outputs, which are never written.
      if (warp < 2 && warp * 8 < rows) {
        // FlashAttention-2's softmax_rescale_o for row srow, this thread's keys 8n + 2·part + v.
        // The row's keys in this block: those before `visible`.
        const int64_t past = row_keys - static_cast<int64_t>(b) * N;
        const int visible = past <= 0 ? 0 : past >= N ? N : static_cast<int>(past);
        float x[N / 4];
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
#pragma unroll
          for (int v = 0; v < 2; ++v) {
            const int key = 8 * n + 2 * part + v;
            x[2 * n + v] = key < visible ? sh.s[srow][key] : -INFINITY;
          }
        }
        float m = row_max;
#pragma unroll
        for (int j = 0; j < N / 4; ++j) m = fmaxf(m, x[j]);
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        const float current = m == -INFINITY ? 0.f : m;
        const float rescale = exp2f((row_max - current) * a.scale_log2);
        row_sum *= rescale;
        const float max_scaled = m == -INFINITY ? 0.f : m * a.scale_log2;
#pragma unroll
        for (int n = 0; n < N / 8; ++n) {
          const float e0 = fao_exp(x[2 * n], a.scale_log2, max_scaled);
          const float e1 = fao_exp(x[2 * n + 1], a.scale_log2, max_scaled);
          row_sum += e0;
          row_sum += e1;
          *reinterpret_cast<__nv_bfloat162*>(&sh.p[srow][8 * n + 2 * part]) =
              __floats2bfloat162_rn(e0, e1);
        }
        row_max = m;
        if (part == 0) sh.rescale[srow] = rescale;
      }
    } else {
      // O = O · rescale + P·V over this warp's columns, 16 keys a step.
      if (from == 0) {
        const float r0 = sh.rescale[g], r1 = sh.rescale[g + 8];
#pragma unroll
        for (int o = 0; o < OUT_TILES; ++o) {
          acc[o][0] *= r0;
          acc[o][1] *= r0;
          acc[o][2] *= r1;
          acc[o][3] *= r1;
        }
      }
#pragma unroll
      for (int ks = 0; ks < FAO_ITEM / 16; ++ks) {
        unsigned pa[4];
        load_a<N + FAO_PAD>(pa, sh.p, from + ks * 16, lane);
#pragma unroll
        for (int o = 0; o < OUT_TILES; o += 2) {
          unsigned vb[4];
          // Matrices (transposed): keys ks·16.. and ks·16 + 8.. of columns c, then of c + 8.
          const int c = warp * (D / 4) + o * 8;
          ldmatrix_x4_trans(vb, &slot[ks * 16 + lane % 16][c + lane / 16 * 8]);
          mma_16816(acc[o], pa, vb[0], vb[1]);
          mma_16816(acc[o + 1], pa, vb[2], vb[3]);
        }
      }
    }
  }
  copy_async_wait<0>();
  if (warp < 2) {
    float sum = row_sum + __shfl_xor_sync(0xffffffffu, row_sum, 2);
    sum = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
    if (part == 0) {
      if (split) {
        a.part_ml[partial * 32 + 2 * srow] = row_max;
        a.part_ml[partial * 32 + 2 * srow + 1] = sum;
      } else {
        sh.inv_sum[srow] = (sum == 0.f || sum != sum) ? 1.f : fao_reciprocal(sum);
      }
    }
  }
  if (split) {
    // The unnormalised output of this chunk.
    float* o = a.part_o + partial * 16 * D;
#pragma unroll
    for (int j = 0; j < OUT_TILES; ++j) {
      const int c = warp * (D / 4) + j * 8 + 2 * t;
      *reinterpret_cast<float2*>(&o[g * D + c]) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(&o[(g + 8) * D + c]) = make_float2(acc[j][2], acc[j][3]);
    }
    return;
  }
  __syncthreads();
  const float i0 = sh.inv_sum[g], i1 = sh.inv_sum[g + 8];
#pragma unroll
  for (int o = 0; o < OUT_TILES; ++o) {
    const int c = warp * (D / 4) + o * 8 + 2 * t;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half;
      if (r >= rows) continue;
      const float inv = half == 0 ? i0 : i1;
      __nv_bfloat16* out = a.out + static_cast<int64_t>(tile.first + r / group) * a.out_stride +
                           static_cast<int64_t>(kv * group + r % group) * D + c;
      *reinterpret_cast<__nv_bfloat162*>(out) =
          __floats2bfloat162_rn(acc[o][2 * half] * inv, acc[o][2 * half + 1] * inv);
    }
  }
}

// Merges the chunks of the tiles that have more than one (the others are final already):
// out = Σ_c w_c O_c · (1 / Σ_c w_c l_c) with w_c = 2^((m_c − m)·scale·log2 e). Block (kv head,
// tile), a thread per row and 4 columns.
template <int D>
__global__ void fa_order_merge(FaoArgs a) {
  const int kv = blockIdx.x;
  const TileOf tile(a.tiles, blockIdx.y);
  if (a.positions[tile.first + tile.count - 1] < FAO_CHUNK) return;
  const int group = a.heads / a.kv_heads;
  const int r = threadIdx.x / (D / 4), c = threadIdx.x % (D / 4) * 4;
  if (r >= tile.count * group) return;
  const int64_t first = (static_cast<int64_t>(blockIdx.y) * a.kv_heads + kv) * a.chunks;
  const float* ml = a.part_ml + (first * 16 + r) * 2;
  const float* o = a.part_o + (first * 16 + r) * D + c;
  float m = -INFINITY;
  for (int s = 0; s < a.chunks; ++s) m = fmaxf(m, ml[s * 32]);
  float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
  float den = 0.f;
  for (int s = 0; s < a.chunks; ++s) {
    const float ms = ml[s * 32];
    if (ms == -INFINITY) continue;
    const float w = exp2f((ms - m) * a.scale_log2);
    den += w * ml[s * 32 + 1];
    const float4 os = *reinterpret_cast<const float4*>(o + static_cast<int64_t>(s) * 16 * D);
    num.x += w * os.x;
    num.y += w * os.y;
    num.z += w * os.z;
    num.w += w * os.w;
  }
  __nv_bfloat16* out = a.out + static_cast<int64_t>(tile.first + r / group) * a.out_stride +
                       static_cast<int64_t>(kv * group + r % group) * D + c;
  // As FlashAttention-2 normalises: a row whose keys all lie in one chunk (a short row in a tile
  // with longer ones) gets its bits.
  const float inv = (den == 0.f || den != den) ? 1.f : fao_reciprocal(den);
  out[0] = __float2bfloat16(num.x * inv);
  out[1] = __float2bfloat16(num.y * inv);
  out[2] = __float2bfloat16(num.z * inv);
  out[3] = __float2bfloat16(num.w * inv);
}

// Raises the kernel's dynamic shared memory limit and carveout, once per device.
template <int D, int SLOTS>
cudaError_t fao_configure() {
  static bool done[64] = {};
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  if (device < 0 || device >= 64) return cudaErrorInvalidDevice;
  if (!done[device]) {
    e = cudaFuncSetAttribute(fa_order_attention_kernel<D, SLOTS>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(sizeof(FaoShared<D, SLOTS>)));
    if (e != cudaSuccess) return e;
    // All of the unified L1 as shared memory, so that fao_blocks_per_sm blocks fit on a
    // multiprocessor whatever carveout the kernels before it left.
    e = cudaFuncSetAttribute(fa_order_attention_kernel<D, SLOTS>,
                             cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
    done[device] = true;
  }
  return cudaSuccess;
}

template <int D, int SLOTS>
int launch_fa_order_attention(const FaoArgs& args, int tiles, cudaStream_t stream) {
  const cudaError_t e = fao_configure<D, SLOTS>();
  if (e != cudaSuccess) return static_cast<int>(e);
  fa_order_attention_kernel<D, SLOTS><<<dim3(args.kv_heads, tiles, args.chunks), FAO_WARPS * 32,
                                        sizeof(FaoShared<D, SLOTS>), stream>>>(args);
  if (args.chunks > 1) {
    const int rows = args.tiles == nullptr ? args.heads / args.kv_heads : 16;
    fa_order_merge<D><<<dim3(args.kv_heads, tiles), rows * D / 4, 0, stream>>>(args);
  }
  return static_cast<int>(cudaGetLastError());
}

// Runs four copy slots at head size 64 when the launch's blocks all fit four to a
// multiprocessor, else three (the most blocks per multiprocessor). Measured on an H200
// (scripts/bench/fa_order): four slots take 0.5B decode (512 blocks) from 36.1 to 35.2 µs; deeper
// pipelines with fewer blocks per multiprocessor were slower at every decode shape (0.5B 54–90 µs
// with 5–12 slots; 7B 75–123 against 72 µs with three), as the kernel's time goes to its
// barriers and softmax more than to waiting for copies. FAO_FORCE_SLOTS (a build switch for
// scripts/bench/fa_order) fixes the depth.
template <int D>
int launch_fa_order_by_depth(const FaoArgs& args, int tiles, cudaStream_t stream) {
#ifdef FAO_FORCE_SLOTS
  return launch_fa_order_attention<D, FAO_FORCE_SLOTS>(args, tiles, stream);
#else
  if (D == 64) {
    static int multiprocessors[64] = {};
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess && (device < 0 || device >= 64)) e = cudaErrorInvalidDevice;
    if (e == cudaSuccess && multiprocessors[device] == 0) {
      e = cudaDeviceGetAttribute(&multiprocessors[device], cudaDevAttrMultiProcessorCount, device);
    }
    if (e != cudaSuccess) return static_cast<int>(e);
    const int sms = multiprocessors[device];
    const int64_t blocks = static_cast<int64_t>(args.kv_heads) * tiles * args.chunks;
    if (blocks <= static_cast<int64_t>(sms) * fao_blocks_per_sm<D, 4>()) {
      return launch_fa_order_attention<D, 4>(args, tiles, stream);
    }
  }
  return launch_fa_order_attention<D, 3>(args, tiles, stream);
#endif
}

FaoArgs fao_args(const void* q, int64_t q_stride, const void* k, int64_t k_stride, const void* v,
                 int64_t v_stride, const int64_t* table, int width, int64_t block_size,
                 const int* tiles, const int64_t* positions, int heads, int kv_heads, float scale,
                 int chunks, float* part_o, float* part_ml, void* out, int64_t out_stride,
                 const FaoRope& rope) {
  // FlashAttention-2's host code: params.scale_softmax_log2 = softmax_scale * M_LOG2E, a float
  // times a double, stored as float.
  const float scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  return FaoArgs{static_cast<const __nv_bfloat16*>(q),
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
                 scale_log2,
                 chunks,
                 part_o,
                 part_ml,
                 static_cast<__nv_bfloat16*>(out),
                 out_stride,
                 rope};
}

int fao_launch(const FaoArgs& args, int n_tiles, int dim, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(args.k) % 16 != 0 || args.k_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(args.v) % 16 != 0 || args.v_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(args.out) % 4 != 0 || args.out_stride % 2 != 0) {
    return static_cast<int>(cudaErrorMisalignedAddress);
  }
  if (dim == 64) return launch_fa_order_by_depth<64>(args, n_tiles, stream);
  if (dim == 128) return launch_fa_order_by_depth<128>(args, n_tiles, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

extern "C" {

// Chunks of a launch whose rows see at most `read_len` keys; the partials of ooze_launch_fa_order_
// attention need room for that many.
int ooze_fa_order_chunks(int read_len) { return (read_len + FAO_CHUNK - 1) / FAO_CHUNK; }

// See fa_order_attention_kernel. Arguments as ooze_launch_split_attention's, without the split
// partials and log-sum-exp: q/k/v_stride are elements between consecutive rows; table, width and
// block_size the KeyMap; tiles int32 [n_tiles, 3] or null (decode: tile i is token i of sequence
// i); out [tokens, ·] rows of out_stride elements. `scale` is the softmax scale as a float, as
// FlashAttention-2 receives it. chunks: ooze_fa_order_chunks(an upper bound of the key counts);
// above 1, part_o / part_ml hold [tiles, kv_heads, chunks, 16, dim] and [.., 2] floats.
int ooze_launch_fa_order_attention(const void* q, int64_t q_stride, const void* k,
                                   int64_t k_stride, const void* v, int64_t v_stride,
                                   const int64_t* table, int width, int64_t block_size,
                                   const int* tiles, int n_tiles, const int64_t* positions,
                                   int heads, int kv_heads, int dim, float scale, int chunks,
                                   float* part_o, float* part_ml, void* out, int64_t out_stride,
                                   cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(q) % 16 != 0 || q_stride % 8 != 0) {
    return static_cast<int>(cudaErrorMisalignedAddress);
  }
  return fao_launch(
      fao_args(q, q_stride, k, k_stride, v, v_stride, table, width, block_size, tiles, positions,
               heads, kv_heads, scale, chunks, part_o, part_ml, out, out_stride, FaoRope{}),
      n_tiles, dim, stream);
}

// Decode (row r: one new token at positions[r], keys through table row r) with rope_store folded
// in (FaoRope): q, k and v come from qkv [rows, ≥ (heads + 2 kv_heads) · dim] (bf16, rows
// qkv_stride elements apart, 16-byte aligned), rotated by cos / signed_sin [rows, dim]; the new
// key and value go into cell cells[r] of k / v (rows k_stride / v_stride apart) before any key is
// read. Otherwise as ooze_launch_fa_order_attention with null tiles.
int ooze_launch_fa_order_decode_rope(const void* qkv, int64_t qkv_stride, const void* cos,
                                     const void* signed_sin, const int64_t* cells, void* k,
                                     int64_t k_stride, void* v, int64_t v_stride,
                                     const int64_t* table, int width, int64_t block_size, int rows,
                                     const int64_t* positions, int heads, int kv_heads, int dim,
                                     float scale, int chunks, float* part_o, float* part_ml,
                                     void* out, int64_t out_stride, cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(qkv) % 16 != 0 || qkv_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(cos) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(signed_sin) % 16 != 0) {
    return static_cast<int>(cudaErrorMisalignedAddress);
  }
  using B = __nv_bfloat16;
  const FaoRope rope{static_cast<const B*>(qkv),
                     qkv_stride,
                     static_cast<const B*>(cos),
                     static_cast<const B*>(signed_sin),
                     cells,
                     static_cast<B*>(k),
                     static_cast<B*>(v)};
  return fao_launch(fao_args(nullptr, 0, k, k_stride, v, v_stride, table, width, block_size,
                             /*tiles=*/nullptr, positions, heads, kv_heads, scale, chunks, part_o,
                             part_ml, out, out_stride, rope),
                    rows, dim, stream);
}

}  // extern "C"
