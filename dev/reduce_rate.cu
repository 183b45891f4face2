// Rate of the copy engine's f32 reduce-add into global memory (cp.reduce.async.bulk ... add.f32,
// the fused backward's dQ path), to decide whether a fused 192 / 128 backward (dQ = dS K inside
// the 64-key split-role kernel) can stream its dQ parts: it would add 48 KB per 64 x 64 step,
// about 19 bytes per SM cycle at the dK/dV kernel's 62% tensor-pipe rate (dev/NOTES.md
// "Measurements written for the next GPU session", item 2), against ~8 at d128's fused kernel.
//
// One CTA per SM; thread 0 issues bulk operations of `chunk` bytes from one shared-memory buffer
// into a destination chosen per operation from a `working set` of global memory (a scattered walk,
// so CTAs meet on the same lines at random, as key blocks meet on a query block's dQ), keeping at
// most 4 bulk groups in flight. Modes: reduce (add.f32), store (plain bulk copy; the write-only
// reference). Prints GB/s of source bytes and bytes per SM cycle at the measured clock (events
// and clock64 of CTA 0). Every CUDA call is checked. Build: nvcc -std=c++20 -arch=sm_90a -O3 -I src
// dev/reduce_rate.cu -o /tmp/reduce_rate; run: /tmp/reduce_rate
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda/ptx/tma.h"
#include "cuda_exit_check.h"


namespace {

constexpr int kMaxChunk = 48 * 1024;

__device__ __forceinline__ void bulk_store(float* gmem, const float* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(reinterpret_cast<uint64_t>(gmem)),
               "r"(flashattn::ptx::smem_u32(smem)), "r"(bytes)
               : "memory");
}

template <bool kReduce>
__global__ void __launch_bounds__(128, 1)
    stream_kernel(float* dst, int64_t slots, int chunk, int ops, long long* cycles) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < chunk / 4; i += blockDim.x) buf[i] = 1.0f / float(1 + i % 7);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  if (threadIdx.x != 0) return;
  const long long t0 = clock64();
  uint64_t x = 0x9e3779b97f4a7c15ull * (blockIdx.x + 1);
  for (int op = 0; op < ops; ++op) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    float* d = dst + int64_t(x % uint64_t(slots)) * (chunk / 4);
    if constexpr (kReduce) {
      flashattn::ptx::bulk_reduce_add_f32(d, buf, chunk);
    } else {
      bulk_store(d, buf, chunk);
    }
    flashattn::ptx::bulk_commit_group();
    flashattn::ptx::bulk_wait_group_read<3>();
  }
  flashattn::ptx::bulk_wait_group<0>();
  if (blockIdx.x == 0) *cycles = clock64() - t0;
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t max_set = int64_t(256) << 20;
  float* dst = nullptr;
  long long* cycles = nullptr;
  CHECK(cudaMalloc(&dst, max_set));
  CHECK(cudaMemset(dst, 0, max_set));
  CHECK(cudaMalloc(&cycles, sizeof(long long)));
  CHECK(cudaFuncSetAttribute(stream_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxChunk));
  CHECK(cudaFuncSetAttribute(stream_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxChunk));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::printf("%-7s %6s %8s %9s %9s %7s\n", "mode", "chunk", "set_MB", "GB/s", "B/SMcyc", "MHz");
  const int chunks[] = {16 * 1024, 48 * 1024};
  const int64_t sets_mb[] = {8, 32, 256};
  for (int reduce = 1; reduce >= 0; --reduce) {
    for (int chunk : chunks) {
      for (int64_t set_mb : sets_mb) {
        const int64_t slots = (set_mb << 20) / chunk;
        const int ops = int((int64_t(2) << 30) / (int64_t(sms) * chunk));  // 2 GB of source bytes in all
        for (int rep = 0; rep < 2; ++rep) {  // the first run warms up
          CHECK(cudaEventRecord(e0));
          if (reduce) {
            stream_kernel<true><<<sms, 128, chunk>>>(dst, slots, chunk, ops, cycles);
          } else {
            stream_kernel<false><<<sms, 128, chunk>>>(dst, slots, chunk, ops, cycles);
          }
          CHECK(cudaGetLastError());
          CHECK(cudaEventRecord(e1));
          CHECK(cudaEventSynchronize(e1));
        }
        float ms = 0;
        long long cyc = 0;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        CHECK(cudaMemcpy(&cyc, cycles, sizeof(cyc), cudaMemcpyDeviceToHost));
        const double bytes = double(ops) * sms * chunk;
        const double mhz = double(cyc) / (ms * 1e3);
        std::printf("%-7s %5dK %8lld %9.0f %9.1f %7.0f\n", reduce ? "reduce" : "store", chunk / 1024,
                    static_cast<long long>(set_mb), bytes / (ms * 1e6), bytes / sms / double(cyc), mhz);
      }
    }
  }
  CHECK(cudaFree(dst));
  CHECK(cudaFree(cycles));
  return 0;
}
