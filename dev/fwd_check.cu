// dev/fwd_check: the sm80 forward kernel against a float64 host reference on fresh random inputs
// (ragged shapes, masks, GQA, varlen, softcap, ALiBi, dropout), then timed with CUDA events.
// Experiment harness only; the official tests are tests/cpp. Build: dev/build.sh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/params.h"
#include "core/philox.h"
#include "cuda/common/build_config.h"
#include "flashattn/flashattn.h"
#include "cuda_exit_check.h"

using namespace flashattn;

struct Case {
  int b, sq, sk, h, hk, d;
  bool causal;
  int wl, wr;
  float softcap;
  bool alibi;
  float dropout;
  bool varlen;
  bool bf16;
  int splits = 0;  // 0 = heuristic
};

static Status run_cuda_forward(const ForwardArgs& a) {
  ForwardParams p;
  Status st = make_forward_params(a, &p);
  return st.ok() ? cuda_forward(p) : st;
}

static uint16_t to_half_bits(float f, bool bf16) {
  if (bf16) {
    __nv_bfloat16 v = __float2bfloat16_rn(f);
    uint16_t r;
    std::memcpy(&r, &v, 2);
    return r;
  }
  __half v = __float2half_rn(f);
  uint16_t r;
  std::memcpy(&r, &v, 2);
  return r;
}
static double from_half_bits(uint16_t u, bool bf16) {
  if (bf16) {
    __nv_bfloat16 v;
    std::memcpy(&v, &u, 2);
    return double(__bfloat162float(v));
  }
  __half v;
  std::memcpy(&v, &u, 2);
  return double(__half2float(v));
}

// Naive float64 attention over packed (total, heads, d) host arrays.
static void reference(const Case& c, const std::vector<int>& cuq, const std::vector<int>& cuk,
                      const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<float>& slopes,
                      std::vector<double>& o, std::vector<double>& lse, int total_q) {
  const double scale = 1.0 / std::sqrt(double(c.d));
  int wl = c.causal ? -1 : c.wl, wr = c.causal ? 0 : c.wr;
  for (int b = 0; b < c.b; ++b) {
    const int sq = cuq[b + 1] - cuq[b], sk = cuk[b + 1] - cuk[b];
    for (int h = 0; h < c.h; ++h) {
      const int hk = h / (c.h / c.hk);
      std::vector<double> s(sk);
      for (int i = 0; i < sq; ++i) {
        double mx = -INFINITY;
        for (int j = 0; j < sk; ++j) {
          double acc = 0;
          for (int e = 0; e < c.d; ++e)
            acc += q[(size_t(cuq[b] + i) * c.h + h) * c.d + e] * k[(size_t(cuk[b] + j) * c.hk + hk) * c.d + e];
          acc *= scale;
          if (c.softcap > 0) acc = c.softcap * std::tanh(acc / c.softcap);
          const long dg = long(i) + sk - sq;
          if (c.alibi) acc -= slopes[b * c.h + h] * std::fabs(double(dg - j));
          bool vis = (wl < 0 || j >= dg - wl) && (wr < 0 || j <= dg + wr);
          s[j] = vis ? acc : -INFINITY;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < sk; ++j) {
          s[j] = mx == -INFINITY ? 0.0 : std::exp(s[j] - mx);
          sum += s[j];
        }
        lse[size_t(h) * total_q + cuq[b] + i] = sum > 0 ? mx + std::log(sum) : -INFINITY;
        const uint32_t thr = dropout_threshold(c.dropout);
        for (int e = 0; e < c.d; ++e) {
          double acc = 0;
          for (int j = 0; j < sk; ++j) {
            double p = s[j];
            if (c.dropout > 0) {
              p = dropout_keep(0x1234567890ull, 77, uint32_t(b * c.h + h), i, j, thr) ? p / (1.0 - c.dropout) : 0.0;
            }
            acc += p * v[(size_t(cuk[b] + j) * c.hk + hk) * c.d + e];
          }
          o[(size_t(cuq[b] + i) * c.h + h) * c.d + e] = sum > 0 ? acc / sum : 0.0;
        }
      }
    }
  }
}

static bool run_case(const Case& c, std::mt19937& rng) {
  std::vector<int> cuq(c.b + 1, 0), cuk(c.b + 1, 0);
  int max_q = 0, max_k = 0;
  for (int b = 0; b < c.b; ++b) {
    int lq = c.sq, lk = c.sk;
    if (c.varlen) {
      lq = b == 1 ? 0 : int(rng() % (c.sq + 1));
      lk = int(rng() % (c.sk + 1));
    }
    cuq[b + 1] = cuq[b] + lq;
    cuk[b + 1] = cuk[b] + lk;
    max_q = std::max(max_q, lq);
    max_k = std::max(max_k, lk);
  }
  const int tq = cuq[c.b], tk = cuk[c.b];
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](size_t n, std::vector<uint16_t>& bits, std::vector<double>& val) {
    bits.resize(n);
    val.resize(n);
    for (size_t i = 0; i < n; ++i) {
      bits[i] = to_half_bits(nd(rng), c.bf16);
      val[i] = from_half_bits(bits[i], c.bf16);
    }
  };
  std::vector<uint16_t> hq, hk, hv;
  std::vector<double> dq, dk, dv;
  fill(size_t(tq) * c.h * c.d, hq, dq);
  fill(size_t(tk) * c.hk * c.d, hk, dk);
  fill(size_t(tk) * c.hk * c.d, hv, dv);
  std::vector<float> slopes(c.b * c.h);
  for (auto& s : slopes) s = 0.05f + 0.5f * float(rng() % 1000) / 1000.f;

  void *gq, *gk, *gv, *go, *gl, *gcq, *gck, *gs;
  CHECK(cudaMalloc(&gq, std::max<size_t>(2, hq.size() * 2)));
  CHECK(cudaMalloc(&gk, std::max<size_t>(2, hk.size() * 2)));
  CHECK(cudaMalloc(&gv, std::max<size_t>(2, hv.size() * 2)));
  CHECK(cudaMalloc(&go, std::max<size_t>(2, hq.size() * 2)));
  CHECK(cudaMalloc(&gl, std::max<size_t>(4, size_t(c.h) * tq * 4)));
  CHECK(cudaMalloc(&gcq, (c.b + 1) * 4));
  CHECK(cudaMalloc(&gck, (c.b + 1) * 4));
  CHECK(cudaMalloc(&gs, slopes.size() * 4));
  CHECK(cudaMemcpy(gq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(gk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(gv, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(gcq, cuq.data(), (c.b + 1) * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(gck, cuk.data(), (c.b + 1) * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(gs, slopes.data(), slopes.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(go, 0xFF, hq.size() * 2));  // poison: NaN bits
  CHECK(cudaMemset(gl, 0xFF, size_t(c.h) * tq * 4));

  const DType dt = c.bf16 ? DType::kBFloat16 : DType::kFloat16;
  const Device dev{DeviceType::kCUDA, 0};
  ForwardArgs a;
  if (c.varlen) {
    a.q = make_contiguous_view(gq, dt, dev, {tq, c.h, c.d});
    a.k = make_contiguous_view(gk, dt, dev, {tk, c.hk, c.d});
    a.v = make_contiguous_view(gv, dt, dev, {tk, c.hk, c.d});
    a.out = make_contiguous_view(go, dt, dev, {tq, c.h, c.d});
    a.lse = make_contiguous_view(gl, DType::kFloat32, dev, {c.h, tq});
    a.cu_seqlens_q = make_contiguous_view(gcq, DType::kInt32, dev, {c.b + 1});
    a.cu_seqlens_k = make_contiguous_view(gck, DType::kInt32, dev, {c.b + 1});
    a.max_seqlen_q = std::max(1, max_q);
    a.max_seqlen_k = std::max(1, max_k);
  } else {
    a.q = make_contiguous_view(gq, dt, dev, {c.b, c.sq, c.h, c.d});
    a.k = make_contiguous_view(gk, dt, dev, {c.b, c.sk, c.hk, c.d});
    a.v = make_contiguous_view(gv, dt, dev, {c.b, c.sk, c.hk, c.d});
    a.out = make_contiguous_view(go, dt, dev, {c.b, c.sq, c.h, c.d});
    a.lse = make_contiguous_view(gl, DType::kFloat32, dev, {c.b, c.h, c.sq});
  }
  a.causal = c.causal;
  a.window_left = c.wl;
  a.window_right = c.wr;
  a.softcap = c.softcap;
  if (c.alibi) a.alibi_slopes = make_contiguous_view(gs, DType::kFloat32, dev, {c.b, c.h});
  a.dropout_p = c.dropout;
  a.seed = 0x1234567890ull;
  a.offset = 77;
  a.num_splits = c.splits;
  Status st = run_cuda_forward(a);
  CHECK(cudaDeviceSynchronize());
  if (!st.ok()) {
    std::printf("FAIL status %s\n", st.message().c_str());
    return false;
  }
  std::vector<uint16_t> ho(hq.size());
  std::vector<float> hl(size_t(c.h) * tq);
  CHECK(cudaMemcpy(ho.data(), go, ho.size() * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hl.data(), gl, hl.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<double> ro(hq.size()), rl(hl.size());
  reference(c, cuq, cuk, dq, dk, dv, slopes, ro, rl, tq);
  double max_err = 0, max_ref = 0, lse_err = 0;
  bool nan = false;
  for (size_t i = 0; i < ro.size(); ++i) {
    const double x = from_half_bits(ho[i], c.bf16);
    if (std::isnan(x)) nan = true;
    max_err = std::max(max_err, std::fabs(x - ro[i]));
    max_ref = std::max(max_ref, std::fabs(ro[i]));
  }
  // LSE: dense layout (b, h, sq) vs reference (h, total_q)
  for (int b = 0; b < c.b; ++b)
    for (int h = 0; h < c.h; ++h)
      for (int i = 0; i < cuq[b + 1] - cuq[b]; ++i) {
        const size_t gi = c.varlen ? size_t(h) * tq + cuq[b] + i : (size_t(b) * c.h + h) * c.sq + i;
        const double r = rl[size_t(h) * tq + cuq[b] + i];
        const double x = hl[gi];
        if (std::isinf(r)) {
          if (!(std::isinf(x) && x < 0)) nan = true;
        } else {
          if (std::isnan(x)) nan = true;
          lse_err = std::max(lse_err, std::fabs(x - r));
        }
      }
  // Tolerance: a few units of the storage precision relative to the output's magnitude.
  const double eps = c.bf16 ? 1.0 / 128 : 1.0 / 1024;
  const double tol = 4 * eps * std::max(1.0, max_ref) * (c.dropout > 0 ? 2 : 1);
  const bool ok = !nan && max_err <= tol && lse_err <= 1e-2;
  std::printf("%s b%d sq%d sk%d h%d/%d d%d %s causal%d win(%d,%d) cap%.0f alibi%d drop%.2f varlen%d: "
              "splits%d max_err %.3g (tol %.3g) lse_err %.3g%s\n",
              ok ? "ok  " : "FAIL", c.b, c.sq, c.sk, c.h, c.hk, c.d, c.bf16 ? "bf16" : "fp16", c.causal,
              c.wl, c.wr, c.softcap, c.alibi, c.dropout, c.varlen, c.splits, max_err, tol, lse_err, nan ? " NaN!" : "");
  for (void* ptr : {gq, gk, gv, go, gl, gcq, gck, gs}) CHECK(cudaFree(ptr));
  return ok;
}

static void bench(int d, int seqlen, bool causal, bool bf16) {
  const int b = 16384 / seqlen, h = 2048 / d;
  const size_t n = size_t(b) * seqlen * h * d;
  const DType dt = bf16 ? DType::kBFloat16 : DType::kFloat16;
  const Device dev{DeviceType::kCUDA, 0};
  void *q, *k, *v, *o, *l;
  CHECK(cudaMalloc(&q, n * 2));
  CHECK(cudaMalloc(&k, n * 2));
  CHECK(cudaMalloc(&v, n * 2));
  CHECK(cudaMalloc(&o, n * 2));
  CHECK(cudaMalloc(&l, size_t(b) * h * seqlen * 4));
  std::vector<uint16_t> host(n);
  std::mt19937 rng(d * 7 + seqlen);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : host) x = to_half_bits(nd(rng), bf16);
  CHECK(cudaMemcpy(q, host.data(), n * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(k, host.data(), n * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(v, host.data(), n * 2, cudaMemcpyHostToDevice));
  ForwardArgs a;
  a.q = make_contiguous_view(q, dt, dev, {b, seqlen, h, d});
  a.k = make_contiguous_view(k, dt, dev, {b, seqlen, h, d});
  a.v = make_contiguous_view(v, dt, dev, {b, seqlen, h, d});
  a.out = make_contiguous_view(o, dt, dev, {b, seqlen, h, d});
  a.lse = make_contiguous_view(l, DType::kFloat32, dev, {b, h, seqlen});
  a.causal = causal;
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; ++i) {
    Status s = run_cuda_forward(a);
    if (!s.ok()) {
      std::printf("bench error: %s\n", s.message().c_str());
      std::exit(1);
    }
  }
  std::vector<float> ms;
  for (int i = 0; i < 30; ++i) {
    CHECK(cudaEventRecord(e0));
    (void)run_cuda_forward(a);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float t;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  const double flops = 4.0 * b * h * double(seqlen) * seqlen * d / (causal ? 2 : 1);
  std::printf("bench d%d n%d b%d h%d %s causal%d: %.3f ms  %.1f TFLOP/s\n", d, seqlen, b, h,
              bf16 ? "bf16" : "fp16", causal, med, flops / med / 1e9);
  for (void* p : {q, k, v, o, l}) CHECK(cudaFree(p));
}

// Decode: one query token, 32 query heads over 8 KV heads, d128, bf16; effective KV bytes/s.
static void bench_decode(int b, int sk) {
  const int h = 32, hk = 8, d = 128;
  const size_t nkv = size_t(b) * sk * hk * d;
  const Device dev{DeviceType::kCUDA, 0};
  void *q, *k, *v, *o;
  CHECK(cudaMalloc(&q, size_t(b) * h * d * 2));
  CHECK(cudaMalloc(&k, nkv * 2));
  CHECK(cudaMalloc(&v, nkv * 2));
  CHECK(cudaMalloc(&o, size_t(b) * h * d * 2));
  CHECK(cudaMemset(q, 0x3c, size_t(b) * h * d * 2));
  CHECK(cudaMemset(k, 0x3c, nkv * 2));
  CHECK(cudaMemset(v, 0x3c, nkv * 2));
  ForwardArgs a;
  a.q = make_contiguous_view(q, DType::kBFloat16, dev, {b, 1, h, d});
  a.k = make_contiguous_view(k, DType::kBFloat16, dev, {b, sk, hk, d});
  a.v = make_contiguous_view(v, DType::kBFloat16, dev, {b, sk, hk, d});
  a.out = make_contiguous_view(o, DType::kBFloat16, dev, {b, 1, h, d});
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; ++i) (void)run_cuda_forward(a);
  std::vector<float> ms;
  for (int i = 0; i < 30; ++i) {
    CHECK(cudaEventRecord(e0));
    Status st = run_cuda_forward(a);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    if (!st.ok()) { std::printf("decode error %s\n", st.message().c_str()); return; }
    float t;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  std::printf("decode b%d sk%d: %.1f us  %.2f TB/s (KV bytes)\n", b, sk, med * 1e3, 2.0 * nkv * 2 / med / 1e9);
  for (void* p : {q, k, v, o}) CHECK(cudaFree(p));
}

int main(int argc, char** argv) {
  // Flags: --no-check (skip correctness), --bench (time the SDPA-comparison shapes),
  // --decode (time decode shapes), --dims=64,128 (head dims to time; default 64,128,256).
  bool check = true, do_bench = false, do_decode = false;
  std::vector<int> bench_dims = {64, 128, 256};
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--no-check") check = false;
    else if (arg == "--bench") do_bench = true;
    else if (arg == "--decode") do_decode = true;
    else if (arg.rfind("--dims=", 0) == 0) {
      bench_dims.clear();
      for (size_t pos = 7; pos < arg.size();) {
        size_t end = arg.find(',', pos);
        if (end == std::string::npos) end = arg.size();
        bench_dims.push_back(std::stoi(arg.substr(pos, end - pos)));
        pos = end + 1;
      }
    }
  }
  std::mt19937 rng(std::random_device{}());
  int fails = 0, total = 0;
  if (check) {
    const int dims[] = {32, 64, 96, 128, 192, 256};
    std::vector<Case> cases;
    for (int d : dims) {
      for (bool bf16 : {true, false}) {
        cases.push_back({2, 129, 300, 4, 2, d, false, -1, -1, 0, false, 0, false, bf16});
        cases.push_back({1, 7, 64, 8, 1, d, true, -1, -1, 0, false, 0, false, bf16});
      }
      cases.push_back({2, 300, 129, 2, 2, d, true, -1, -1, 0, false, 0, false, true});
      cases.push_back({3, 200, 200, 2, 1, d, false, 40, 10, 0, false, 0, false, true});
      cases.push_back({2, 150, 150, 2, 2, d, false, -1, -1, 30, true, 0, false, true});
      cases.push_back({2, 97, 130, 2, 2, d, false, -1, -1, 0, false, 0.17f, false, true});
      cases.push_back({3, 140, 170, 4, 2, d, true, -1, -1, 0, false, 0, true, true});
      cases.push_back({1, 1, 1, 1, 1, d, false, -1, -1, 0, false, 0, false, true});
      cases.push_back({1, 300, 64, 2, 2, d, false, 0, 0, 0, false, 0, false, true});
      cases.push_back({1, 64, 300, 2, 2, d, false, 5, -1, 0, false, 0, false, false});
      // Split-KV: forced split counts, decode shapes under the heuristic, varlen + splits.
      cases.push_back({2, 129, 700, 4, 2, d, false, -1, -1, 0, false, 0, false, true, 3});
      cases.push_back({2, 70, 500, 4, 1, d, true, -1, -1, 0, false, 0, false, true, 4});
      cases.push_back({2, 1, 3000, 8, 2, d, false, -1, -1, 0, false, 0, false, true, 0});
      cases.push_back({2, 1, 3000, 8, 2, d, true, -1, -1, 0, false, 0, false, false, 0});
      cases.push_back({3, 50, 900, 2, 2, d, false, 100, 0, 20, true, 0.1f, true, true, 5});
    }
    for (const Case& c : cases) {
      if (!cuda::head_dim_built(c.d)) continue;
      ++total;
      if (!run_case(c, rng)) ++fails;
    }
    std::printf("correctness: %d passed, %d failed\n", total - fails, fails);
  }
  if (do_bench) {
    for (int d : bench_dims)
      for (int n : {512, 2048, 8192, 16384})
        for (bool causal : {false, true}) bench(d, n, causal, true);
  }
  if (do_decode) {
    bench_decode(1, 4096);
    bench_decode(8, 65536);
    bench_decode(8, 131072);
    bench_decode(64, 4096);
    bench_decode(64, 16384);
  }
  return fails == 0 ? 0 : 1;
}
