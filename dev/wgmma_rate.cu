// Tensor-pipe rate of wgmma shapes on one SM, to decide whether the backward's m64n64 products
// with both operands in shared memory (S^T = K Q^T, dP^T = V dO^T) are bound by shared-memory
// bandwidth (dev/NOTES.md "Measurements written for the next GPU session", item 3).
//
// One CTA per SM, W warpgroups, each issuing bf16 m64nNk16 products in a loop over its own A and
// B tiles (128-byte swizzled, K-major, as the kernels' Q and K): groups of four k16 steps into one
// of two accumulators (N <= 128) or one (N > 128), at most two groups in flight. SS reads A and B
// from shared memory, RS reads A from registers. Prints MACs per SM cycle (clock64 over the loop,
// the slowest warpgroup) and TFLOP/s (events), per shape and W; the dense bf16 peak is 2048 MACs
// per SM cycle. Every CUDA call is checked. Build: nvcc -std=c++20 -arch=sm_90a -O3 -I src
// dev/wgmma_rate.cu -o /tmp/wgmma_rate; run: /tmp/wgmma_rate [--json FILE]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/ptx/smem_desc.h"
#include "cuda/ptx/wgmma.h"
#include "cuda/ptx/wgmma_ops.h"
#include "cuda_exit_check.h"


namespace {
using flashattn::ptx::smem_desc;
using flashattn::ptx::SmemSwizzle;

constexpr int kATileBytes = 64 * 128;  // 64 rows x 64 K-elements

template <int N>
using Op = flashattn::ptx::Wgmma<N, __nv_bfloat16>;

template <int N, bool kRs>
__device__ __forceinline__ void group(float (&acc)[N / 2], uint64_t da, uint64_t db, const uint32_t (&a)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // four k16 steps along one 128-byte row: 32 bytes each
    if constexpr (kRs)
      Op<N>::template rs<0>(acc, a, db + 2 * k, 1);
    else
      Op<N>::template ss<0>(acc, da + 2 * k, db + 2 * k, 1);
  }
  flashattn::ptx::wgmma_commit();
}

template <int N, bool kRs, int kWg>
__global__ void __launch_bounds__(128 * kWg) rate_kernel(int iters, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (reinterpret_cast<uintptr_t>(smem_raw) & 1023)) & 1023);
  const int wg = threadIdx.x / 128;
  constexpr int kBTileBytes = N * 128;
  unsigned char* a_tile = smem + wg * (kATileBytes + kBTileBytes);
  unsigned char* b_tile = a_tile + kATileBytes;
  // Bounded, nonzero bf16 values (|x| < 1), so the products do real work.
  for (int i = threadIdx.x % 128; i < (kATileBytes + kBTileBytes) / 2; i += 128) {
    unsigned h = (i + 1) * 2654435761u + wg * 97u;
    reinterpret_cast<__nv_bfloat16*>(a_tile)[i] = __float2bfloat16(float(int(h >> 8) % 2001 - 1000) * 1e-3f);
  }
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint64_t da = smem_desc(static_cast<uint32_t>(__cvta_generic_to_shared(a_tile)), 16, 1024, SmemSwizzle::k128B);
  const uint64_t db = smem_desc(static_cast<uint32_t>(__cvta_generic_to_shared(b_tile)), 16, 1024, SmemSwizzle::k128B);
  uint32_t a[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = 0x3c003c00u ^ (threadIdx.x * 0x00010001u * (i + 1) & 0x007f007fu);
  constexpr int kAccs = N <= 128 ? 2 : 1;
  float acc[kAccs][N / 2];
#pragma unroll
  for (int j = 0; j < kAccs; ++j)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[j][i] = 0.f;
#pragma unroll
  for (int j = 0; j < kAccs; ++j) flashattn::ptx::fence_operand(acc[j]);
  flashattn::ptx::wgmma_fence();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < kAccs; ++j) {
      group<N, kRs>(acc[j], da, db, a);
      flashattn::ptx::wgmma_wait<1>();
    }
  }
  flashattn::ptx::wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < kAccs; ++j) flashattn::ptx::fence_operand(acc[j]);
  const long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kAccs; ++j)
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s += acc[j][i];
  if (s == 12345.f) sink[threadIdx.x] = s;  // keeps the products live
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * kWg + wg] = t1 - t0;
}

struct Result {
  int n, wg;
  bool rs;
  double macs_per_cycle, tflops;
};

template <int N, bool kRs, int kWg>
Result run(int sms) {
  constexpr int kBTileBytes = N * 128;
  const int smem = kWg * (kATileBytes + kBTileBytes) + 1024;
  auto kernel = rate_kernel<N, kRs, kWg>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  long long* cycles;
  float* sink;
  CHECK(cudaMalloc(&cycles, sizeof(long long) * sms * kWg));
  CHECK(cudaMalloc(&sink, sizeof(float) * 128 * kWg));
  const int groups_per_iter = N <= 128 ? 2 : 1;
  const int iters = (N <= 128 ? 20000 : 40000) * 64 / N;
  kernel<<<sms, 128 * kWg, smem>>>(16, cycles, sink);  // warm-up
  CHECK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  kernel<<<sms, 128 * kWg, smem>>>(iters, cycles, sink);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  std::vector<long long> cyc(sms * kWg);
  CHECK(cudaMemcpy(cyc.data(), cycles, sizeof(long long) * cyc.size(), cudaMemcpyDeviceToHost));
  long long worst = 0;
  for (long long c : cyc) worst = c > worst ? c : worst;
  const double macs_per_wg = double(iters) * groups_per_iter * 4 * 64.0 * N * 16;
  CHECK(cudaFree(cycles));
  CHECK(cudaFree(sink));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return {N, kWg, kRs, macs_per_wg * kWg / double(worst), 2.0 * macs_per_wg * kWg * sms / (ms * 1e-3) / 1e12};
}

template <int N, bool kRs>
void sweep(int sms, std::vector<Result>& out) {
  out.push_back(run<N, kRs, 1>(sms));
  out.push_back(run<N, kRs, 2>(sms));
  out.push_back(run<N, kRs, 3>(sms));
}
}  // namespace

int main(int argc, char** argv) {
  const char* json = argc > 2 && std::strcmp(argv[1], "--json") == 0 ? argv[2] : nullptr;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::vector<Result> rs;
  sweep<64, false>(sms, rs);
  sweep<64, true>(sms, rs);
  sweep<128, false>(sms, rs);
  sweep<128, true>(sms, rs);
  sweep<192, false>(sms, rs);
  sweep<192, true>(sms, rs);
  sweep<256, false>(sms, rs);
  sweep<256, true>(sms, rs);
  std::printf("%-10s %3s %3s %14s %9s\n", "shape", "op", "WGs", "MACs/SM/cycle", "TFLOP/s");
  for (const Result& r : rs)
    std::printf("m64n%-4dk16 %3s %3d %14.0f %9.0f\n", r.n, r.rs ? "RS" : "SS", r.wg, r.macs_per_cycle, r.tflops);
  if (json) {
    FILE* f = std::fopen(json, "w");
    if (!f) {
      std::perror(json);
      return 1;
    }
    std::fprintf(f, "{\"gpu\": \"%s\", \"rows\": [\n", prop.name);
    for (size_t i = 0; i < rs.size(); ++i)
      std::fprintf(f, "  {\"n\": %d, \"op\": \"%s\", \"warpgroups\": %d, \"macs_per_sm_cycle\": %.1f, \"tflops\": %.1f}%s\n",
                   rs[i].n, rs[i].rs ? "RS" : "SS", rs[i].wg, rs[i].macs_per_cycle, rs[i].tflops,
                   i + 1 < rs.size() ? "," : "");
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
