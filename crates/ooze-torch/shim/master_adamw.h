// What the master-weight AdamW kernel (master_adamw.cu) takes, shared with its entry point in
// ops.cpp: one descriptor per parameter tensor. Plain C: nvcc compiles the kernel without the
// libtorch headers.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

// One parameter: its bf16 gradient, fp32 master weight and moments, the bf16 model weight the
// master is written back to, its step counter (fp32 scalar, already incremented for this step),
// its element count and weight decay.
struct OozeAdamWTensor {
  const void* grad;
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
  void* model;
  const float* step;
  int64_t numel;
  float weight_decay;
};

extern "C" {
// Elements of a parameter one block updates.
int64_t ooze_master_adamw_chunk();
// `tensors` [n] and `first_chunk` [n + 1] (each tensor's first chunk; the last entry the total)
// in device memory; `divisor` a device fp32 scalar every gradient is divided by (clipping).
int ooze_launch_master_adamw(const OozeAdamWTensor* tensors, const int64_t* first_chunk, int n,
                             int64_t chunks, const float* divisor, float lr, float beta1,
                             float beta2, float eps, cudaStream_t stream);
}
