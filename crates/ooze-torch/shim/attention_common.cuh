// Device pieces shared by the attention kernels (attention.cu, fa_order_attention.cu): where a
// sequence's keys live, a tile's tokens, asynchronous copies into shared memory and programmatic
// dependent launch.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

// Where the keys and values of a sequence live. Paged (block_size > 0): position p of sequence s
// is cell table[s · width + p / block_size] · block_size + p % block_size. Contiguous
// (block_size == 0): row table[s] + p.
struct KeyMap {
  const int64_t* table;
  int width;
  int64_t block_size;
  // The table entry that position p of sequence seq goes through.
  __device__ __forceinline__ int64_t index(int seq, int64_t p) const {
    return block_size == 0 ? seq : static_cast<int64_t>(seq) * width + p / block_size;
  }
  __device__ __forceinline__ int64_t cell(int seq, int64_t p) const {
    return cell_at(table[index(seq, p)], p);
  }
  // cell(seq, p) where the block table reaches position p, else 0 (a position past the table,
  // never read): safe to look up before knowing how many keys the sequence has.
  __device__ __forceinline__ int64_t cell_if_mapped(int seq, int64_t p) const {
    return block_size == 0 || p / block_size < width ? cell(seq, p) : 0;
  }
  // cell(seq, p) in two halves, so that a kernel can issue the table read early and use it late:
  // `entry` reads the table (0 past its end), `cell_at` turns what it read into the cell.
  __device__ __forceinline__ int64_t entry(int seq, int64_t p) const {
    return block_size == 0 || p / block_size < width ? table[index(seq, p)] : 0;
  }
  __device__ __forceinline__ int64_t cell_at(int64_t entry, int64_t p) const {
    return block_size == 0 ? entry + p : entry * block_size + p % block_size;
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

__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(global));
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// Lets the kernel launched after this one on the stream start its blocks early, where the
// launcher asked for it (programmatic dependent launch, Hopper on); it still waits for this
// kernel's results (dependent_wait).
__device__ __forceinline__ void dependents_may_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}
// Waits until the kernel before this one on the stream has finished and its writes are visible
// (a no-op unless launched as a programmatic dependent).
__device__ __forceinline__ void dependent_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace
