// The engine's sampler and the trainer's log-prob kernels over fp32 logits, one block of
// SAMPLE_THREADS threads per row. Both compute the row's log-sum-exp with one arithmetic
// (add_group: groups of four logits, the same threads, the same order and merges), so the log-prob
// the engine reports for a sampled token equals, bitwise, the one the trainer computes from the
// same logits.
//
// - log_prob_forward / log_prob_backward: log_softmax(logits · inv_temp) at the targets, the
//   log-sum-exp and the entropy, and the gradient (the LM head's fused log-prob in training).
// - sample: per row, the greedy token (first maximum) or the inverse-CDF token of the row's
//   uniform in vocabulary order, and its log-prob.

#include "common.cuh"

namespace {

constexpr int SAMPLE_THREADS = 1024;
constexpr int SAMPLE_WARPS = SAMPLE_THREADS / 32;

struct Moments {
  float max, sum, weighted;  // running max m, Σ e^{x−m}, Σ e^{x−m}·x
};

__device__ __forceinline__ Moments merge_moments(Moments a, Moments b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.f, 0.f};
  const float ea = expf(a.max - m), eb = expf(b.max - m);
  // Written as the fused multiply-adds they compile to, so every caller gets the same bits.
  return {m, __fmaf_rn(a.sum, ea, __fmul_rn(b.sum, eb)),
          __fmaf_rn(a.weighted, ea, __fmul_rn(b.weighted, eb))};
}

// Four scaled logits (scaled with __fmul_rn, so that no caller's compilation fuses the scaling into
// what follows) added to a thread's running moments. The running max moves only when a
// group exceeds it (the sums are rescaled then, rarely after the first groups); otherwise the four
// exponentials are taken against it as it stands. Returns the group's Σ e^{x−m} against the
// running max after the group (the sampler's chunk masses). Every kernel that needs a row's
// log-sum-exp adds its groups through this, in the same order per thread, so they agree bitwise.
// The exponentials are the hardware's (ex2.approx of x·log2 e: two instructions against about
// ten for expf; relative error ~1e-6 at |x| ≤ 30, far inside what bf16 logits carry): the
// sampler's time goes to issuing instructions, not to reading its row.
__device__ __forceinline__ float add_group(Moments& acc, float a, float b, float c, float d) {
  const float m = fmaxf(fmaxf(a, b), fmaxf(c, d));
  if (m > acc.max) {
    const float r = __expf(__fsub_rn(acc.max, m));
    acc.sum = __fmul_rn(acc.sum, r);
    acc.weighted = __fmul_rn(acc.weighted, r);
    acc.max = m;
  }
  if (acc.max == -INFINITY) return 0.f;
  const float ea = __expf(__fsub_rn(a, acc.max)), eb = __expf(__fsub_rn(b, acc.max)),
              ec = __expf(__fsub_rn(c, acc.max)), ed = __expf(__fsub_rn(d, acc.max));
  const float group = __fadd_rn(__fadd_rn(ea, eb), __fadd_rn(ec, ed));
  acc.sum = __fadd_rn(acc.sum, group);
  acc.weighted =
      __fmaf_rn(ed, d, __fmaf_rn(ec, c, __fmaf_rn(eb, b, __fmaf_rn(ea, a, acc.weighted))));
  return group;
}

__device__ __forceinline__ Moments shfl_moments(Moments m, int offset) {
  return {__shfl_xor_sync(0xffffffffu, m.max, offset),
          __shfl_xor_sync(0xffffffffu, m.sum, offset),
          __shfl_xor_sync(0xffffffffu, m.weighted, offset)};
}

// The block's moments from each thread's: within warps, then across the warps' (in warp 0);
// every thread gets the result.
__device__ Moments block_moments(Moments acc) {
  for (int offset = 16; offset > 0; offset >>= 1) acc = merge_moments(acc, shfl_moments(acc, offset));
  __shared__ Moments s_part[SAMPLE_WARPS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) s_part[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = s_part[lane];
    for (int offset = 16; offset > 0; offset >>= 1) acc = merge_moments(acc, shfl_moments(acc, offset));
    if (lane == 0) s_part[0] = acc;
  }
  __syncthreads();
  return s_part[0];
}

// log_softmax at one logit, from the row's log-sum-exp.
__device__ __forceinline__ float log_prob_of(float logit, float inv_temp, float lse) {
  return __fsub_rn(__fmul_rn(logit, inv_temp), lse);
}

// Logits 4i … 4i + 3 of a row: one 16-byte read where the row starts 16-byte aligned.
__device__ __forceinline__ float4 group_of(const float* x, int i, bool aligned) {
  return aligned ? reinterpret_cast<const float4*>(x)[i]
                 : make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
}

// The same from bf16 logits: one 8-byte read where the row starts 8-byte aligned.
__device__ __forceinline__ float4 group_of(const __nv_bfloat16* x, int i, bool aligned) {
  if (aligned) {
    float v[4];
    Quad<__nv_bfloat16>::load(x + 4 * i, v);
    return make_float4(v[0], v[1], v[2], v[3]);
  }
  return make_float4(__bfloat162float(x[4 * i]), __bfloat162float(x[4 * i + 1]),
                     __bfloat162float(x[4 * i + 2]), __bfloat162float(x[4 * i + 3]));
}

// Calls f(q, i) for this thread's groups of four logits, i = tid, tid + SAMPLE_THREADS, … in that
// order, with 64 bytes of loads in flight (four float groups or eight bf16 ones; less leaves a
// block of 1024 threads about half the bytes in flight that HBM needs). Every caller's arithmetic
// stays in this order.
template <typename TIn, typename F>
__device__ __forceinline__ void for_each_group(const TIn* x, int groups, bool aligned, F f) {
  constexpr int K = 64 / (4 * sizeof(TIn));
  int i = threadIdx.x;
  for (; i + (K - 1) * SAMPLE_THREADS < groups; i += K * SAMPLE_THREADS) {
    float4 q[K];
#pragma unroll
    for (int k = 0; k < K; ++k) q[k] = group_of(x, i + k * SAMPLE_THREADS, aligned);
#pragma unroll
    for (int k = 0; k < K; ++k) f(q[k], i + k * SAMPLE_THREADS);
  }
  for (; i < groups; i += SAMPLE_THREADS) f(group_of(x, i, aligned), i);
}

// Per row of logits [rows, vocab] (fp32, or bf16 as a bf16 matmul wrote them; x = logits ·
// inv_temp): the log-prob of the target, logsumexp and entropy (lse − E[x]), no full-vocabulary
// output; optionally (fp32 logits) the logits rounded to bf16 for the backward. `aligned`: rows
// start 16-byte (fp32) or 8-byte (bf16) aligned (the arithmetic is the same either way).
template <typename TIn>
__global__ void __launch_bounds__(SAMPLE_THREADS)
    log_prob_forward_kernel(const TIn* __restrict__ logits, int vocab,
                            const int64_t* __restrict__ targets, float inv_temp, bool aligned,
                            float* __restrict__ log_prob, float* __restrict__ lse_out,
                            float* __restrict__ entropy, __nv_bfloat16* __restrict__ logits_bf16) {
  const int row = blockIdx.x, tid = threadIdx.x;
  const TIn* x = logits + static_cast<int64_t>(row) * vocab;
  Moments acc{-INFINITY, 0.f, 0.f};
  if (vocab % 4 == 0) {
    __nv_bfloat16* keep =
        logits_bf16 ? logits_bf16 + static_cast<int64_t>(row) * vocab : nullptr;
    for_each_group(x, vocab / 4, aligned, [&](float4 q, int i) {
      if (keep) {
        Pair<__nv_bfloat16>::store(keep + 4 * i, make_float2(q.x, q.y));
        Pair<__nv_bfloat16>::store(keep + 4 * i + 2, make_float2(q.z, q.w));
      }
      add_group(acc, __fmul_rn(q.x, inv_temp), __fmul_rn(q.y, inv_temp), __fmul_rn(q.z, inv_temp),
                __fmul_rn(q.w, inv_temp));
    });
  } else {
    for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
      const float xi = to_float(x[i]);
      if (logits_bf16) logits_bf16[static_cast<int64_t>(row) * vocab + i] = __float2bfloat16(xi);
      const float v = __fmul_rn(xi, inv_temp);
      acc = merge_moments(acc, Moments{v, 1.f, v});
    }
  }
  acc = block_moments(acc);
  if (tid == 0) {
    const float lse = acc.max + logf(acc.sum);
    lse_out[row] = lse;
    log_prob[row] = log_prob_of(to_float(x[targets[row]]), inv_temp, lse);
    entropy[row] = lse - acc.weighted / acc.sum;
  }
}

// d logits = g · inv_temp · (onehot(target) − softmax(x)), written in T (the matmul's dtype).
// `out` may be `logits` itself (each element is read, then written, by one thread).
template <typename TIn, typename T>
__global__ void log_prob_backward_kernel(const TIn* logits, int vocab,
                                         const int64_t* __restrict__ targets,
                                         const float* __restrict__ lse,
                                         const float* __restrict__ grad, float inv_temp, T* out) {
  const int row = blockIdx.x;
  const int64_t base = static_cast<int64_t>(row) * vocab;
  const float g = grad[row] * inv_temp, l = lse[row];
  const int64_t target = targets[row];
  if (vocab % 4 == 0) {
    for (int i = threadIdx.x; i < vocab / 4; i += blockDim.x) {
      const int j = 4 * i;
      const float2 lo = Pair<TIn>::load(logits + base + j), hi = Pair<TIn>::load(logits + base + j + 2);
      const float4 q = make_float4(lo.x, lo.y, hi.x, hi.y);
      const float d0 = g * ((j == target ? 1.f : 0.f) - expf(q.x * inv_temp - l));
      const float d1 = g * ((j + 1 == target ? 1.f : 0.f) - expf(q.y * inv_temp - l));
      const float d2 = g * ((j + 2 == target ? 1.f : 0.f) - expf(q.z * inv_temp - l));
      const float d3 = g * ((j + 3 == target ? 1.f : 0.f) - expf(q.w * inv_temp - l));
      Pair<T>::store(out + base + j, make_float2(d0, d1));
      Pair<T>::store(out + base + j + 2, make_float2(d2, d3));
    }
    return;
  }
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float p = expf(to_float(logits[base + i]) * inv_temp - l);
    out[base + i] = from_float<T>(g * ((i == target ? 1.f : 0.f) - p));
  }
}

struct ArgMax {
  float value;
  int index;
};

__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  // The first index wins ties (PyTorch's argmax); NaN never wins.
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// The block's first maximum; every thread gets it.
__device__ ArgMax block_argmax(ArgMax am) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    am = better(am, ArgMax{__shfl_xor_sync(0xffffffffu, am.value, offset),
                           __shfl_xor_sync(0xffffffffu, am.index, offset)});
  }
  __shared__ ArgMax s_best[SAMPLE_WARPS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) s_best[warp] = am;
  __syncthreads();
  if (warp == 0) {
    am = s_best[lane];
    for (int offset = 16; offset > 0; offset >>= 1) {
      am = better(am, ArgMax{__shfl_xor_sync(0xffffffffu, am.value, offset),
                             __shfl_xor_sync(0xffffffffu, am.index, offset)});
    }
    if (lane == 0) s_best[0] = am;
  }
  __syncthreads();
  return s_best[0];
}

// e^{x·inv_temp − max}, rounded the same way wherever the inverse CDF needs it.
__device__ __forceinline__ float weight_of(float logit, float inv_temp, float max) {
  return expf(__fsub_rn(__fmul_rn(logit, inv_temp), max));
}

// The inclusive prefix sum of one value per lane, in lane order (a Hillis-Steele scan).
__device__ __forceinline__ float warp_inclusive_scan(float v, int lane) {
  for (int offset = 1; offset < 32; offset <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) v += y;
  }
  return v;
}

// Walks tokens [begin, end) of a row in vocabulary order, one warp, 32 tokens a round, from the
// mass `running` before `begin`: the first token whose inclusive mass passes `target`, or when
// rounding lets none pass, the last token with any mass before that point; -1 when the span has
// no mass. Every lane returns the same token.
__device__ int walk_to_target(const float* x, int begin, int end, float inv_temp, float max,
                              float running, float target, int lane) {
  int pick = -1;
  // Eight rounds of 32 tokens read ahead (the rounds themselves stay serial).
  constexpr int AHEAD = 8;
  float ahead[AHEAD];
  for (int base = begin; base < end; base += 32) {
    const int round = ((base - begin) >> 5) % AHEAD;
    if (round == 0) {
#pragma unroll
      for (int k = 0; k < AHEAD; ++k) {
        const int j = base + 32 * k + lane;
        ahead[k] = j < end ? x[j] : 0.f;
      }
    }
    const int i = base + lane;
    float logit = ahead[0];
#pragma unroll
    for (int k = 1; k < AHEAD; ++k) logit = round == k ? ahead[k] : logit;
    const float p = i < end ? weight_of(logit, inv_temp, max) : 0.f;
    const float incl = warp_inclusive_scan(p, lane);
    const unsigned crossed = __ballot_sync(0xffffffffu, running + incl > target);
    const unsigned mass = __ballot_sync(0xffffffffu, p > 0.f);
    if (crossed != 0u) {
      // The crossing token has mass unless the scan's rounding says otherwise: then the last
      // token before it that has.
      const unsigned upto = mass & ((2u << (__ffs(crossed) - 1)) - 1u);
      if (upto != 0u) pick = base + 31 - __clz(upto);
      break;
    }
    if (mass != 0u) pick = base + 31 - __clz(mass);
    running += __shfl_sync(0xffffffffu, incl, 31);
  }
  return pick;
}

// The inclusive prefix, over the block's threads in order, of one value per thread; every thread
// gets its own prefix and (through `total`) the block's sum.
__device__ float block_inclusive_scan(float v, float* total) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = warp_inclusive_scan(v, lane);
  __shared__ float s_warp[SAMPLE_WARPS];
  if (lane == 31) s_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    s_warp[lane] = warp_inclusive_scan(s_warp[lane], lane);
  }
  __syncthreads();
  *total = s_warp[SAMPLE_WARPS - 1];
  const float before = warp == 0 ? 0.f : s_warp[warp - 1];
  __syncthreads();  // s_warp may be reused by the next call
  return before + v;
}

// The one-pass path's chunks: the 32 groups of four a warp reads in one round, 128 consecutive
// tokens. Vocabularies of up to MAX_CHUNKS chunks (262,144 tokens) take it.
constexpr int CHUNK_TOKENS = 128;
constexpr int MAX_CHUNKS = 2048;

// Sampled rows, one pass over the logits: the row's moments exactly as the trainer's kernel
// computes them (the same threads, groups and order through add_group: its log-sum-exp), and
// beside them each chunk's mass (a warp's round, 128 consecutive tokens) against a reference the
// warp keeps: the largest of its lanes' running maxes, refreshed (with each lane's factor
// e^{max − reference}) only in rounds where some lane's max moved. The chunks' masses then locate
// u · total, and one warp walks that chunk's 128 tokens. Writes the moments; returns the token,
// or -1 where rounding left no chunk holding the target.
__device__ int sample_in_one_pass(const float* x, int vocab, bool aligned, float inv_temp, float u,
                                  Moments* moments) {
  __shared__ float s_chunk_max[MAX_CHUNKS], s_chunk_mass[MAX_CHUNKS];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int groups = vocab / 4;
  const int rounds = (groups + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
  const int chunks = (vocab + CHUNK_TOKENS - 1) / CHUNK_TOKENS;
  Moments acc{-INFINITY, 0.f, 0.f};
  // The warp's reference, and this lane's factor against it, as of the lane's max `factor_of`.
  float reference = -INFINITY, factor = 0.f, factor_of = -INFINITY;
  // Four rounds' loads in flight, as for_each_group; every warp takes part in every round (the
  // chunk sums are warp-wide), lanes past the row with nothing.
  for (int r0 = 0; r0 < rounds; r0 += 4) {
    float4 q[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = tid + (r0 + k) * SAMPLE_THREADS;
      q[k] = i < groups ? group_of(x, i, aligned) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (r0 + k >= rounds) break;
      const int i = tid + (r0 + k) * SAMPLE_THREADS;
      const float group =
          i < groups ? add_group(acc, __fmul_rn(q[k].x, inv_temp), __fmul_rn(q[k].y, inv_temp),
                                 __fmul_rn(q[k].z, inv_temp), __fmul_rn(q[k].w, inv_temp))
                     : 0.f;
      if (__any_sync(0xffffffffu, acc.max != factor_of)) {
        reference = acc.max;
        for (int offset = 16; offset > 0; offset >>= 1)
          reference = fmaxf(reference, __shfl_xor_sync(0xffffffffu, reference, offset));
        factor = acc.max == -INFINITY ? 0.f : expf(acc.max - reference);
        factor_of = acc.max;
      }
      const float mass = warp_sum(group * factor);
      const int chunk = (i - lane) >> 5;
      if (lane == 0 && chunk < chunks) {
        s_chunk_max[chunk] = reference;
        s_chunk_mass[chunk] = mass;
      }
    }
  }
  acc = block_moments(acc);
  *moments = acc;
  // Each thread takes two consecutive chunks (chunks ≤ 2 · SAMPLE_THREADS); their masses at the
  // row's max, scanned in chunk order.
  const float max = acc.max;
  float mine[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int c = 2 * tid + k;
    mine[k] = c < chunks && s_chunk_max[c] > -INFINITY
                  ? s_chunk_mass[c] * expf(s_chunk_max[c] - max)
                  : 0.f;
  }
  float total;
  const float incl = block_inclusive_scan(mine[0] + mine[1], &total);
  const float target = u * total;
  // The first thread whose prefix passes the target owns it (rounding may make neighbouring
  // prefixes disagree slightly; the minimum keeps the choice deterministic).
  __shared__ int s_owner, s_chunk;
  __shared__ float s_before;
  if (tid == 0) {
    s_owner = SAMPLE_THREADS;
    s_chunk = -1;
  }
  __syncthreads();
  if (incl > target) atomicMin(&s_owner, tid);
  __syncthreads();
  if (tid == s_owner) {
    const float excl = incl - (mine[0] + mine[1]);
    const bool first = excl + mine[0] > target || mine[1] == 0.f;
    s_chunk = 2 * tid + (first ? 0 : 1);
    s_before = first ? excl : excl + mine[0];
  }
  __syncthreads();
  const int chunk = s_chunk;
  if (chunk < 0) return -1;
  __shared__ int s_pick;
  if (warp == 0) {
    const int begin = chunk * CHUNK_TOKENS, end = min(begin + CHUNK_TOKENS, vocab);
    const int pick = walk_to_target(x, begin, end, inv_temp, max, s_before, target, lane);
    if (lane == 0) s_pick = pick;
  }
  __syncthreads();
  return s_pick;
}

// Sampled rows of other vocabularies, after the row's moments: a second pass over the logits. Warp
// w owns the w-th of 32 contiguous segments; a scan of the segments' masses finds the one holding
// u · total, and that warp walks it. Returns the token, or -1 where rounding left no segment
// holding the target.
__device__ int sample_by_segments(const float* x, int vocab, float inv_temp, float max, float u) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int segment = ((vocab + SAMPLE_WARPS - 1) / SAMPLE_WARPS + 31) / 32 * 32;
  const int begin = min(warp * segment, vocab), end = min(begin + segment, vocab);
  // Eight loads in flight per lane, summed in the same order as one at a time.
  float part = 0.f;
  int i = begin + lane;
  for (; i + 7 * 32 < end; i += 8 * 32) {
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = x[i + 32 * k];
#pragma unroll
    for (int k = 0; k < 8; ++k) part += weight_of(v[k], inv_temp, max);
  }
  for (; i < end; i += 32) part += weight_of(x[i], inv_temp, max);
  part = warp_sum(part);
  __shared__ float s_upto[SAMPLE_WARPS];  // inclusive prefix of the segments' sums
  if (lane == 0) s_upto[warp] = part;
  __syncthreads();
  if (warp == 0) {
    s_upto[lane] = warp_inclusive_scan(s_upto[lane], lane);
  }
  __syncthreads();
  const float target = u * s_upto[SAMPLE_WARPS - 1];
  int owner = SAMPLE_WARPS;
  for (int w = 0; w < SAMPLE_WARPS; ++w) {
    if (s_upto[w] > target) {
      owner = w;
      break;
    }
  }
  __shared__ int s_pick;
  if (threadIdx.x == 0) s_pick = -1;
  __syncthreads();
  if (warp == owner) {
    const float running = owner == 0 ? 0.f : s_upto[owner - 1];
    const int pick = walk_to_target(x, begin, end, inv_temp, max, running, target, lane);
    if (lane == 0) s_pick = pick;
  }
  __syncthreads();
  return s_pick;
}

// One block per row. params is [3, rows]: inv_temp (1/T, as the trainer scales; 1 for greedy),
// greedy flag (0/1), uniform u in [0, 1). out is [2, rows] (double): the token, then its log-prob
// log_softmax(logits · inv_temp), equal to log_prob_forward_kernel's for the same row. `aligned`:
// rows start 16-byte aligned (float4 reads; the arithmetic is the same either way).
__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float* __restrict__ logits, int64_t stride, int vocab,
                  const float* __restrict__ params, int rows, bool aligned,
                  double* __restrict__ out) {
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const float* x = logits + row * stride;
  const float inv_temp = params[row];
  const bool greedy = params[rows + row] != 0.f;
  const float u = params[2 * rows + row];

  Moments acc{-INFINITY, 0.f, 0.f};
  ArgMax am{-INFINITY, vocab};
  int token = -1;
  const bool one_pass =
      !greedy && vocab % 4 == 0 && (vocab + CHUNK_TOKENS - 1) / CHUNK_TOKENS <= MAX_CHUNKS;
  if (one_pass) {
    token = sample_in_one_pass(x, vocab, aligned, inv_temp, u, &acc);
  } else {
    // The log-sum-exp as the trainer's kernel computes it, and the first maximum.
    if (vocab % 4 == 0) {
      for_each_group(x, vocab / 4, aligned, [&](float4 q, int i) {
        const float a = __fmul_rn(q.x, inv_temp), b = __fmul_rn(q.y, inv_temp),
                    c = __fmul_rn(q.z, inv_temp), d = __fmul_rn(q.w, inv_temp);
        add_group(acc, a, b, c, d);
        am = better(am, ArgMax{a, 4 * i});
        am = better(am, ArgMax{b, 4 * i + 1});
        am = better(am, ArgMax{c, 4 * i + 2});
        am = better(am, ArgMax{d, 4 * i + 3});
      });
    } else {
      for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
        const float v = __fmul_rn(x[i], inv_temp);
        acc = merge_moments(acc, Moments{v, 1.f, v});
        am = better(am, ArgMax{v, i});
      }
    }
    acc = block_moments(acc);
    am = block_argmax(am);
    token = greedy ? min(am.index, vocab - 1) : sample_by_segments(x, vocab, inv_temp, acc.max, u);
  }
  const float lse = acc.max + logf(acc.sum);
  if (token < 0 && tid == 0) {
    // Rounding left nothing holding the target (u·total at the very end): the last token with
    // any mass, as PyTorch's clamped searchsorted would give (a row with none at all, only
    // -inf or NaN logits: the last token, whichever path sampled it).
    token = vocab - 1;
    for (int i = vocab - 1; i >= 0; --i) {
      if (weight_of(x[i], inv_temp, acc.max) > 0.f) {
        token = i;
        break;
      }
    }
  }
  if (tid == 0) {
    out[row] = static_cast<double>(token);
    out[rows + row] = static_cast<double>(log_prob_of(x[token], inv_temp, lse));
  }
}

}  // namespace

extern "C" {

int ooze_launch_log_prob_forward(const float* logits, int rows, int vocab,
                                 const int64_t* targets, float inv_temp, float* log_prob,
                                 float* lse, float* entropy, void* logits_bf16,
                                 cudaStream_t stream) {
  const bool aligned = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  log_prob_forward_kernel<float>
      <<<rows, SAMPLE_THREADS, 0, stream>>>(logits, vocab, targets, inv_temp, aligned, log_prob,
                                            lse, entropy, static_cast<__nv_bfloat16*>(logits_bf16));
  return static_cast<int>(cudaGetLastError());
}

// ooze_launch_log_prob_forward over bf16 logits [rows, vocab] (contiguous rows).
int ooze_launch_log_prob_forward_bf16(const void* logits, int rows, int vocab,
                                      const int64_t* targets, float inv_temp, float* log_prob,
                                      float* lse, float* entropy, cudaStream_t stream) {
  const bool aligned = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 8 == 0;
  log_prob_forward_kernel<__nv_bfloat16><<<rows, SAMPLE_THREADS, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(logits), vocab, targets, inv_temp, aligned, log_prob, lse,
      entropy, nullptr);
  return static_cast<int>(cudaGetLastError());
}

int ooze_launch_log_prob_backward(int bf16, const void* logits, int logits_bf16, int rows,
                                  int vocab, const int64_t* targets, const float* lse,
                                  const float* grad, float inv_temp, void* out,
                                  cudaStream_t stream) {
  using B = __nv_bfloat16;
  if (logits_bf16) {
    log_prob_backward_kernel<B, B><<<rows, 1024, 0, stream>>>(
        static_cast<const B*>(logits), vocab, targets, lse, grad, inv_temp, static_cast<B*>(out));
  } else if (bf16) {
    log_prob_backward_kernel<float, B><<<rows, 1024, 0, stream>>>(
        static_cast<const float*>(logits), vocab, targets, lse, grad, inv_temp,
        static_cast<B*>(out));
  } else {
    log_prob_backward_kernel<float, float><<<rows, 1024, 0, stream>>>(
        static_cast<const float*>(logits), vocab, targets, lse, grad, inv_temp,
        static_cast<float*>(out));
  }
  return static_cast<int>(cudaGetLastError());
}

int ooze_launch_sample(const float* logits, int64_t stride, int vocab, const float* params,
                       int rows, double* out, cudaStream_t stream) {
  const bool aligned = stride % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  sample_kernel<<<rows, SAMPLE_THREADS, 0, stream>>>(logits, stride, vocab, params, rows,
                                                     aligned, out);
  return static_cast<int>(cudaGetLastError());
}

}  // extern "C"
