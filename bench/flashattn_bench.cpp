// flashattn-bench: times forward (and backward) of one attention shape on the CPU or a CUDA GPU,
// reports median time and TFLOP/s, and checks the result against the float64 reference.
//
//   flashattn-bench [--device cpu|cuda] [--batch B] [--seqlen-q N] [--heads H] ... [--json]
//
// FLOPs follow docs/DESIGN: forward 2 * B * H * Nq * Nk * (d + dv) (= 4 B H Nq Nk d), halved for
// a causal mask with Nq == Nk; other windows count the visible (query, key) pairs exactly;
// backward is 2.5x the forward. Exit codes: 0 ok, 1 library/CUDA error or failed check, 2 bad
// command line.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flashattn/flashattn.h"
#include "reference/reference.h"

#if defined(FLASHATTN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

using flashattn::BackwardArgs;
using flashattn::Device;
using flashattn::DeviceType;
using flashattn::DType;
using flashattn::ForwardArgs;
using flashattn::Status;
using flashattn::TensorView;

// ---- command line ------------------------------------------------------------------------

struct Config {
  int batch = 1;
  int seqlen_q = 4096;
  int seqlen_k = -1;  // -1: = seqlen_q
  int heads = 8;
  int heads_k = -1;  // -1: = heads
  int head_dim = 64;
  int head_dim_v = -1;  // -1: = head_dim
  DType dtype = DType::kFloat32;
  bool dtype_given = false;
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  bool alibi = false;
  float dropout = 0.0f;
  uint64_t seed = 0;
  std::string device;  // "" = best available
  int threads = 0;
  int repeats = -1;  // -1: device default
  int warmup = -1;
  bool check = true;
  bool backward = true;
  bool json = false;
  bool reference_speed = false;
  bool shape_given = false;  // any of batch/seqlen/heads/head-dim given
};

void usage(const char* prog) {
  std::fprintf(
      stderr,
      "usage: %s [options]\n"
      "  --device cpu|cuda      default: cuda when available, else cpu\n"
      "  --batch B              default 1 (cpu), 4 (cuda)\n"
      "  --seqlen-q N           default 4096\n"
      "  --seqlen-k N           default = seqlen-q\n"
      "  --heads H              default 8 (cpu), 16 (cuda)\n"
      "  --heads-k H            default = heads (GQA/MQA when smaller)\n"
      "  --head-dim D           default 64 (cpu), 128 (cuda)\n"
      "  --head-dim-v D         default = head-dim\n"
      "  --dtype f32|f16|bf16   default f32 (cpu), bf16 (cuda)\n"
      "  --causal               bottom-right causal mask\n"
      "  --window L,R           sliding window, -1 = unbounded side\n"
      "  --softcap X            tanh soft-capping of the scores\n"
      "  --alibi                ALiBi with the standard slopes 2^(-8 (h+1) / H)\n"
      "  --dropout P            dropout probability\n"
      "  --seed S               seed of the inputs and of dropout (default 0)\n"
      "  --threads T            cpu worker threads (default: all)\n"
      "  --repeats N            timed runs, median reported (default 10 cpu, 30 cuda)\n"
      "  --warmup N             untimed runs first (default 2 cpu, 5 cuda)\n"
      "  --no-backward          time the forward only\n"
      "  --no-check             skip the comparison with the float64 reference\n"
      "  --reference-speed      also time the float64 reference forward on the full shape\n"
      "  --json                 print one JSON object on stdout instead of text\n",
      prog);
}

bool parse_int(const char* s, long lo, long hi, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parse_float(const char* s, float lo, float hi, float* out) {
  char* end = nullptr;
  const float v = std::strtof(s, &end);
  if (end == s || *end != '\0' || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

// Returns false (after printing why) on a bad command line.
bool parse_args(int argc, char** argv, Config* c) {
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "error: %s\n", why.c_str());
    usage(argv[0]);
    return false;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    auto int_flag = [&](int* dst, long lo, long hi) {
      const char* v = value();
      return v != nullptr && parse_int(v, lo, hi, dst);
    };
    bool ok = true;
    if (a == "--batch") {
      ok = int_flag(&c->batch, 0, 1 << 20);
      c->shape_given = true;
    } else if (a == "--seqlen-q") {
      ok = int_flag(&c->seqlen_q, 0, 1 << 30);
      c->shape_given = true;
    } else if (a == "--seqlen-k") {
      ok = int_flag(&c->seqlen_k, 0, 1 << 30);
    } else if (a == "--heads") {
      ok = int_flag(&c->heads, 1, 4096);
      c->shape_given = true;
    } else if (a == "--heads-k") {
      ok = int_flag(&c->heads_k, 1, 4096);
    } else if (a == "--head-dim") {
      ok = int_flag(&c->head_dim, 1, 4096);
      c->shape_given = true;
    } else if (a == "--head-dim-v") {
      ok = int_flag(&c->head_dim_v, 1, 4096);
    } else if (a == "--dtype") {
      const char* v = value();
      const std::string s = v ? v : "";
      c->dtype_given = true;
      if (s == "f32" || s == "float32") {
        c->dtype = DType::kFloat32;
      } else if (s == "f16" || s == "float16") {
        c->dtype = DType::kFloat16;
      } else if (s == "bf16" || s == "bfloat16") {
        c->dtype = DType::kBFloat16;
      } else {
        return fail("--dtype must be f32, f16 or bf16");
      }
    } else if (a == "--causal") {
      c->causal = true;
    } else if (a == "--window") {
      const char* v = value();
      const std::string s = v ? v : "";
      const size_t comma = s.find(',');
      if (comma == std::string::npos ||
          !parse_int(s.substr(0, comma).c_str(), -1, 1 << 30, &c->window_left) ||
          !parse_int(s.substr(comma + 1).c_str(), -1, 1 << 30, &c->window_right)) {
        return fail("--window takes L,R (integers >= -1)");
      }
    } else if (a == "--softcap") {
      const char* v = value();
      ok = v != nullptr && parse_float(v, 0.0f, 1e30f, &c->softcap);
    } else if (a == "--alibi") {
      c->alibi = true;
    } else if (a == "--dropout") {
      const char* v = value();
      ok = v != nullptr && parse_float(v, 0.0f, 0.999f, &c->dropout);
    } else if (a == "--seed") {
      const char* v = value();
      char* end = nullptr;
      ok = v != nullptr;
      if (ok) c->seed = std::strtoull(v, &end, 10);
      ok = ok && end != v && *end == '\0';
    } else if (a == "--device") {
      const char* v = value();
      c->device = v ? v : "";
      ok = c->device == "cpu" || c->device == "cuda";
    } else if (a == "--threads") {
      ok = int_flag(&c->threads, 0, 4096);
    } else if (a == "--repeats") {
      ok = int_flag(&c->repeats, 1, 1000000);
    } else if (a == "--warmup") {
      ok = int_flag(&c->warmup, 0, 1000000);
    } else if (a == "--no-check") {
      c->check = false;
    } else if (a == "--no-backward") {
      c->backward = false;
    } else if (a == "--json") {
      c->json = true;
    } else if (a == "--reference-speed") {
      c->reference_speed = true;
    } else if (a == "--help" || a == "-h") {
      usage(argv[0]);
      std::exit(0);
    } else {
      return fail("unknown option " + a);
    }
    if (!ok) return fail("bad or missing value for " + a);
  }
  return true;
}

// ---- small helpers -----------------------------------------------------------------------

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "error: %s\n", what.c_str());
  std::exit(1);
}

void check_status(const Status& s, const char* what) {
  if (!s.ok()) {
    die(std::string(what) + " failed (" + flashattn::status_code_name(s.code()) +
        "): " + s.message());
  }
}

#if defined(FLASHATTN_WITH_CUDA)
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

const char* dtype_short(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "f32";
    case DType::kFloat16:
      return "f16";
    case DType::kBFloat16:
      return "bf16";
    default:
      return "?";
  }
}

// float <-> storage conversions for the inputs and outputs (round to nearest even).
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
uint16_t to_f16(float f) {
  // Through double: scale into the half grid and round there (exact for finite inputs).
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const double a = std::fabs(static_cast<double>(f));
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 65520.0) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < 6.103515625e-05) {  // subnormal: units of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0)));
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  double mant = std::nearbyint((m * 2.0 - 1.0) * 1024.0);
  int exp = e - 1 + 15;
  if (mant >= 1024.0) {
    mant = 0.0;
    ++exp;
  }
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | (exp << 10) | static_cast<int>(mant));
}
float from_f16(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  double v = 0.0;
  if (e == 0) {
    v = m * std::ldexp(1.0, -24);
  } else if (e == 31) {
    v = m ? NAN : INFINITY;
  } else {
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  }
  return static_cast<float>((h & 0x8000) ? -v : v);
}

// A host tensor stored in the benchmark dtype, with float64 copies for the reference.
struct HostTensor {
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
  std::vector<unsigned char> bytes;

  HostTensor(DType t, int64_t n)
      : dtype(t), numel(n), bytes(static_cast<size_t>(n * flashattn::dtype_size(t))) {}
  size_t nbytes() const { return bytes.size(); }
  void set(int64_t i, float f) {
    if (dtype == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &f, 4);
    } else {
      const uint16_t h = dtype == DType::kFloat16 ? to_f16(f) : to_bf16(f);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  double get(int64_t i) const {
    if (dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return dtype == DType::kFloat16 ? from_f16(h) : float_of(static_cast<uint32_t>(h) << 16);
  }
  void randomize(std::mt19937_64& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < numel; ++i) set(i, nd(rng));
  }
};

// ---- device memory -----------------------------------------------------------------------

struct DeviceMemory {
  Device device;
  std::vector<void*> owned;

  explicit DeviceMemory(Device d) : device(d) {}
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    for (void* p : owned) {
      if (device.type == DeviceType::kCPU) {
        std::free(p);
      } else {
#if defined(FLASHATTN_WITH_CUDA)
        cudaFree(p);  // teardown: nothing useful to do on failure
#endif
      }
    }
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    const size_t n = std::max<size_t>(bytes, 64);
    if (device.type == DeviceType::kCPU) {
      p = std::malloc(n);
      if (p == nullptr) die("out of host memory allocating " + std::to_string(n) + " bytes");
    } else {
#if defined(FLASHATTN_WITH_CUDA)
      cuda_check(cudaMalloc(&p, n), "cudaMalloc");
#endif
    }
    owned.push_back(p);
    return p;
  }
  void upload(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    if (device.type == DeviceType::kCPU) {
      std::memcpy(dst, src, bytes);
    } else {
#if defined(FLASHATTN_WITH_CUDA)
      cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
#endif
    }
  }
  void download(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    if (device.type == DeviceType::kCPU) {
      std::memcpy(dst, src, bytes);
    } else {
#if defined(FLASHATTN_WITH_CUDA)
      cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
#endif
    }
  }
};

// Milliseconds of each of `repeats` calls of fn after `warmup` untimed calls.
std::vector<double> time_calls(const Device& dev, int warmup, int repeats,
                               const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  if (dev.type == DeviceType::kCPU) {
    for (int i = 0; i < repeats; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    return ms;
  }
#if defined(FLASHATTN_WITH_CUDA)
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < repeats; ++i) {
    cuda_check(cudaEventRecord(start, nullptr), "cudaEventRecord");
    fn();
    cuda_check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0.0f;
    cuda_check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cuda_check(cudaEventDestroy(start), "cudaEventDestroy");
  cuda_check(cudaEventDestroy(stop), "cudaEventDestroy");
#endif
  return ms;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- machine description -----------------------------------------------------------------

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t s = colon + 1;
        while (s < line.size() && line[s] == ' ') ++s;
        return line.substr(s);
      }
    }
  }
  return "unknown";
}

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      o += buf;
    } else {
      o += ch;
    }
  }
  return o;
}

// Threads the CPU backend will use for num_threads = t (mirrors its documented rule).
int cpu_threads_used(int t) {
  if (t > 0) return t;
  if (const char* e = std::getenv("FLASHATTN_NUM_THREADS")) {
    const int v = std::atoi(e);
    if (v > 0) return v;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

// ---- FLOPs -------------------------------------------------------------------------------

// Visible (query, key) pairs of one (batch, head).
double visible_pairs(const Config& c) {
  const int64_t sq = c.seqlen_q, sk = c.seqlen_k;
  const int wl = c.causal ? -1 : c.window_left;
  const int wr = c.causal ? 0 : c.window_right;
  if (wl < 0 && wr < 0) return static_cast<double>(sq) * static_cast<double>(sk);
  if (wl < 0 && wr == 0 && sq == sk) return 0.5 * static_cast<double>(sq) * static_cast<double>(sk);
  double n = 0.0;
  for (int64_t i = 0; i < sq; ++i) {
    const int64_t diag = i + sk - sq;
    const int64_t lo = wl < 0 ? 0 : std::max<int64_t>(0, diag - wl);
    const int64_t hi = wr < 0 ? sk - 1 : std::min<int64_t>(sk - 1, diag + wr);
    if (hi >= lo) n += static_cast<double>(hi - lo + 1);
  }
  return n;
}

double forward_flops(const Config& c) {
  return 2.0 * c.batch * c.heads * visible_pairs(c) * (c.head_dim + c.head_dim_v);
}

// ---- the float64 reference on (a part of) the problem -------------------------------------

struct Compared {
  std::string what;  // which part of the problem was compared
  double ref_forward_ms = 0.0;
  double max_err_out = 0.0, max_err_lse = 0.0, max_err_dq = 0.0, max_err_dk = 0.0, max_err_dv = 0.0;
  double max_ref_out = 0.0, max_ref_dq = 0.0, max_ref_dk = 0.0, max_ref_dv = 0.0;
  bool nan = false;
  bool done = false;
};

std::vector<double> alibi_slopes(int heads) {
  std::vector<double> s(static_cast<size_t>(heads));
  for (int h = 0; h < heads; ++h) s[h] = std::exp2(-8.0 * (h + 1) / heads);
  return s;
}

flashattn::reference::Options reference_options(const Config& c, int batch, int heads) {
  flashattn::reference::Options o;
  o.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  o.window_left = c.causal ? -1 : c.window_left;
  o.window_right = c.causal ? 0 : c.window_right;
  o.softcap = c.softcap;
  if (c.alibi) {
    const std::vector<double> all = alibi_slopes(c.heads);
    for (int b = 0; b < batch; ++b) {
      for (int h = 0; h < heads; ++h) o.alibi.push_back(static_cast<float>(all[h]));
    }
  }
  o.dropout_p = c.dropout;
  o.seed = c.seed;
  o.offset = 0;
  return o;
}

// Host copies of every operand (contiguous, (batch, seqlen, heads, dim)).
struct Problem {
  HostTensor q, k, v, dout, out, lse, dq, dk, dv;
  Problem(const Config& c)
      : q(c.dtype, int64_t{c.batch} * c.seqlen_q * c.heads * c.head_dim),
        k(c.dtype, int64_t{c.batch} * c.seqlen_k * c.heads_k * c.head_dim),
        v(c.dtype, int64_t{c.batch} * c.seqlen_k * c.heads_k * c.head_dim_v),
        dout(c.dtype, int64_t{c.batch} * c.seqlen_q * c.heads * c.head_dim_v),
        out(c.dtype, int64_t{c.batch} * c.seqlen_q * c.heads * c.head_dim_v),
        lse(DType::kFloat32, int64_t{c.batch} * c.heads * c.seqlen_q),
        dq(c.dtype, int64_t{c.batch} * c.seqlen_q * c.heads * c.head_dim),
        dk(c.dtype, int64_t{c.batch} * c.seqlen_k * c.heads_k * c.head_dim),
        dv(c.dtype, int64_t{c.batch} * c.seqlen_k * c.heads_k * c.head_dim_v) {}
};

// Copies (batch 0, heads [0, nh)) of a (batch, seqlen, heads, dim) tensor to float64.
std::vector<double> slice(const HostTensor& t, int seqlen, int heads, int dim, int nh) {
  std::vector<double> o(static_cast<size_t>(int64_t{seqlen} * nh * dim));
  for (int64_t s = 0; s < seqlen; ++s) {
    for (int h = 0; h < nh; ++h) {
      for (int e = 0; e < dim; ++e) {
        o[(s * nh + h) * dim + e] = t.get((s * heads + h) * dim + e);
      }
    }
  }
  return o;
}

void max_err(const HostTensor& ours, const std::vector<double>& ref, int seqlen, int heads, int dim,
             int nh, double* err, double* ref_max, bool* nan) {
  for (int64_t s = 0; s < seqlen; ++s) {
    for (int h = 0; h < nh; ++h) {
      for (int e = 0; e < dim; ++e) {
        const double x = ours.get((s * heads + h) * dim + e);
        const double r = ref[(s * nh + h) * dim + e];
        if (std::isnan(x)) *nan = true;
        *err = std::max(*err, std::fabs(x - r));
        *ref_max = std::max(*ref_max, std::fabs(r));
      }
    }
  }
}

// Bytes the reference needs for one (batch, head): it materialises a few seqlen_q x seqlen_k
// float64 matrices.
double reference_bytes(const Config& c) {
  return 4.0 * 8.0 * static_cast<double>(c.seqlen_q) * static_cast<double>(c.seqlen_k);
}

// Compares batch 0 and the first query heads (all heads of the first GQA group, at least 2
// heads when there are 2) with the reference.
Compared compare_with_reference(const Config& c, const Problem& pb, bool with_backward) {
  Compared r;
  if (c.batch == 0) {
    r.what = "nothing (batch 0)";
    return r;
  }
  if (reference_bytes(c) > 6e9) {
    r.what = "nothing: the float64 reference would need " +
             std::to_string(static_cast<int>(reference_bytes(c) / 1e9)) + " GB per head";
    return r;
  }
  const int group = c.heads / c.heads_k;
  int nh = group;
  while (nh < std::min(2, c.heads)) nh += group;
  const int nhk = nh / group;
  r.what = "batch 0, query heads 0.." + std::to_string(nh - 1) + " (kv heads 0.." +
           std::to_string(nhk - 1) + ")" + (with_backward ? ", out/lse/dq/dk/dv" : ", out/lse");
  const auto shape = flashattn::reference::Shape::dense(1, c.seqlen_q, c.seqlen_k, nh, nhk,
                                                        c.head_dim, c.head_dim_v);
  const auto opt = reference_options(c, 1, nh);
  const auto q = slice(pb.q, c.seqlen_q, c.heads, c.head_dim, nh);
  const auto k = slice(pb.k, c.seqlen_k, c.heads_k, c.head_dim, nhk);
  const auto v = slice(pb.v, c.seqlen_k, c.heads_k, c.head_dim_v, nhk);
  std::vector<double> out(static_cast<size_t>(int64_t{c.seqlen_q} * nh * c.head_dim_v));
  std::vector<double> lse(static_cast<size_t>(int64_t{nh} * c.seqlen_q));
  const auto t0 = std::chrono::steady_clock::now();
  flashattn::reference::forward(shape, opt, q.data(), k.data(), v.data(), out.data(), lse.data());
  r.ref_forward_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  max_err(pb.out, out, c.seqlen_q, c.heads, c.head_dim_v, nh, &r.max_err_out, &r.max_ref_out,
          &r.nan);
  for (int h = 0; h < nh; ++h) {
    for (int64_t i = 0; i < c.seqlen_q; ++i) {
      const double ours = pb.lse.get(h * int64_t{c.seqlen_q} + i);  // batch 0
      const double ref = lse[h * c.seqlen_q + i];
      if (std::isnan(ours)) r.nan = true;
      if (std::isinf(ref) || std::isinf(ours)) {
        if (ours != ref) r.max_err_lse = INFINITY;
      } else {
        r.max_err_lse = std::max(r.max_err_lse, std::fabs(ours - ref));
      }
    }
  }
  if (with_backward) {
    const auto g = slice(pb.dout, c.seqlen_q, c.heads, c.head_dim_v, nh);
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
    flashattn::reference::backward(shape, opt, q.data(), k.data(), v.data(), g.data(), dq.data(),
                                   dk.data(), dv.data());
    max_err(pb.dq, dq, c.seqlen_q, c.heads, c.head_dim, nh, &r.max_err_dq, &r.max_ref_dq, &r.nan);
    max_err(pb.dk, dk, c.seqlen_k, c.heads_k, c.head_dim, nhk, &r.max_err_dk, &r.max_ref_dk,
            &r.nan);
    max_err(pb.dv, dv, c.seqlen_k, c.heads_k, c.head_dim_v, nhk, &r.max_err_dv, &r.max_ref_dv,
            &r.nan);
  }
  r.done = true;
  return r;
}

// Times the float64 reference forward on the full shape (single run).
double reference_forward_ms(const Config& c, const Problem& pb) {
  const auto shape = flashattn::reference::Shape::dense(c.batch, c.seqlen_q, c.seqlen_k, c.heads,
                                                        c.heads_k, c.head_dim, c.head_dim_v);
  const auto opt = reference_options(c, c.batch, c.heads);
  std::vector<double> q(static_cast<size_t>(pb.q.numel)), k(static_cast<size_t>(pb.k.numel)),
      v(static_cast<size_t>(pb.v.numel));
  for (int64_t i = 0; i < pb.q.numel; ++i) q[i] = pb.q.get(i);
  for (int64_t i = 0; i < pb.k.numel; ++i) k[i] = pb.k.get(i);
  for (int64_t i = 0; i < pb.v.numel; ++i) v[i] = pb.v.get(i);
  std::vector<double> out(static_cast<size_t>(pb.out.numel));
  std::vector<double> lse(static_cast<size_t>(pb.lse.numel));
  const auto t0 = std::chrono::steady_clock::now();
  flashattn::reference::forward(shape, opt, q.data(), k.data(), v.data(), out.data(), lse.data());
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ---- main --------------------------------------------------------------------------------

TensorView view4(void* data, DType t, const Device& dev, int64_t a, int64_t b, int64_t c,
                 int64_t d) {
  return flashattn::make_contiguous_view(data, t, dev, {a, b, c, d});
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (!parse_args(argc, argv, &c)) return 2;

  // Device and its defaults.
  if (c.device.empty()) c.device = flashattn::cuda_available() ? "cuda" : "cpu";
  Device dev;
  std::string gpu_name;
  if (c.device == "cuda") {
#if defined(FLASHATTN_WITH_CUDA)
    if (!flashattn::cuda_available()) die("--device cuda: no usable CUDA device");
    dev.type = DeviceType::kCUDA;
    cuda_check(cudaSetDevice(0), "cudaSetDevice");
    cudaDeviceProp prop;
    cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    gpu_name = prop.name;
#else
    die("--device cuda: this flashattn-bench was built without CUDA");
#endif
  }
  const bool cuda = dev.type == DeviceType::kCUDA;
  if (cuda && !c.shape_given) {  // docs/DESIGN's GPU setting: batch 16k/seqlen, 16 heads, d128
    c.batch = 4;
    c.heads = 16;
    c.head_dim = 128;
  }
  if (cuda && !c.dtype_given) c.dtype = DType::kBFloat16;
  if (c.seqlen_k < 0) c.seqlen_k = c.seqlen_q;
  if (c.heads_k < 0) c.heads_k = c.heads;
  if (c.head_dim_v < 0) c.head_dim_v = c.head_dim;
  if (c.repeats < 0) c.repeats = cuda ? 30 : 10;
  if (c.warmup < 0) c.warmup = cuda ? 5 : 2;
  if (c.heads % c.heads_k != 0) {
    std::fprintf(stderr, "error: --heads (%d) must be a multiple of --heads-k (%d)\n", c.heads,
                 c.heads_k);
    usage(argv[0]);
    return 2;
  }

  // Inputs.
  Problem pb(c);
  std::mt19937_64 rng(c.seed * 0x9E3779B97F4A7C15ull + 1);
  pb.q.randomize(rng);
  pb.k.randomize(rng);
  pb.v.randomize(rng);
  pb.dout.randomize(rng);
  std::vector<float> slopes;
  if (c.alibi) {
    for (double s : alibi_slopes(c.heads)) slopes.push_back(static_cast<float>(s));
  }

  DeviceMemory mem(dev);
  auto upload = [&](const HostTensor& t) {
    void* p = mem.alloc(t.nbytes());
    mem.upload(p, t.bytes.data(), t.nbytes());
    return p;
  };
  void* d_q = upload(pb.q);
  void* d_k = upload(pb.k);
  void* d_v = upload(pb.v);
  void* d_dout = upload(pb.dout);
  void* d_out = mem.alloc(pb.out.nbytes());
  void* d_lse = mem.alloc(pb.lse.nbytes());
  void* d_dq = mem.alloc(pb.dq.nbytes());
  void* d_dk = mem.alloc(pb.dk.nbytes());
  void* d_dv = mem.alloc(pb.dv.nbytes());
  void* d_slopes = nullptr;
  if (c.alibi) {
    d_slopes = mem.alloc(slopes.size() * sizeof(float));
    mem.upload(d_slopes, slopes.data(), slopes.size() * sizeof(float));
  }

  ForwardArgs fa;
  fa.q = view4(d_q, c.dtype, dev, c.batch, c.seqlen_q, c.heads, c.head_dim);
  fa.k = view4(d_k, c.dtype, dev, c.batch, c.seqlen_k, c.heads_k, c.head_dim);
  fa.v = view4(d_v, c.dtype, dev, c.batch, c.seqlen_k, c.heads_k, c.head_dim_v);
  fa.out = view4(d_out, c.dtype, dev, c.batch, c.seqlen_q, c.heads, c.head_dim_v);
  fa.lse =
      flashattn::make_contiguous_view(d_lse, DType::kFloat32, dev, {c.batch, c.heads, c.seqlen_q});
  fa.causal = c.causal;
  fa.window_left = c.window_left;
  fa.window_right = c.window_right;
  fa.softcap = c.softcap;
  if (c.alibi) {
    fa.alibi_slopes = flashattn::make_contiguous_view(d_slopes, DType::kFloat32, dev, {c.heads});
  }
  fa.dropout_p = c.dropout;
  fa.seed = c.seed;
  fa.num_threads = c.threads;

  BackwardArgs ba;
  static_cast<flashattn::AttentionOptions&>(ba) =
      static_cast<const flashattn::AttentionOptions&>(fa);
  ba.q = fa.q;
  ba.k = fa.k;
  ba.v = fa.v;
  ba.out = fa.out;
  ba.lse = fa.lse;
  ba.dout = view4(d_dout, c.dtype, dev, c.batch, c.seqlen_q, c.heads, c.head_dim_v);
  ba.dq = view4(d_dq, c.dtype, dev, c.batch, c.seqlen_q, c.heads, c.head_dim);
  ba.dk = view4(d_dk, c.dtype, dev, c.batch, c.seqlen_k, c.heads_k, c.head_dim);
  ba.dv = view4(d_dv, c.dtype, dev, c.batch, c.seqlen_k, c.heads_k, c.head_dim_v);

  // Timing.
  const std::vector<double> fwd_ms = time_calls(
      dev, c.warmup, c.repeats, [&] { check_status(flashattn::forward(fa), "forward"); });
  std::vector<double> bwd_ms;
  if (c.backward) {
    bwd_ms = time_calls(dev, c.warmup, c.repeats,
                        [&] { check_status(flashattn::backward(ba), "backward"); });
  }
#if defined(FLASHATTN_WITH_CUDA)
  if (cuda) cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
  const double fwd_flops = forward_flops(c);
  const double bwd_flops = 2.5 * fwd_flops;
  const double fwd_med = median(fwd_ms), bwd_med = median(bwd_ms);
  const double fwd_min = fwd_ms.empty() ? 0.0 : *std::min_element(fwd_ms.begin(), fwd_ms.end());
  const double bwd_min = bwd_ms.empty() ? 0.0 : *std::min_element(bwd_ms.begin(), bwd_ms.end());
  auto tflops = [](double flops, double ms) { return ms > 0.0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };

  // Results back to the host, check against the reference.
  mem.download(pb.out.bytes.data(), d_out, pb.out.nbytes());
  mem.download(pb.lse.bytes.data(), d_lse, pb.lse.nbytes());
  if (c.backward) {
    mem.download(pb.dq.bytes.data(), d_dq, pb.dq.nbytes());
    mem.download(pb.dk.bytes.data(), d_dk, pb.dk.nbytes());
    mem.download(pb.dv.bytes.data(), d_dv, pb.dv.nbytes());
  }
  Compared cmp;
  if (c.check) cmp = compare_with_reference(c, pb, c.backward);
  double ref_full_ms = 0.0;
  if (c.reference_speed) ref_full_ms = reference_forward_ms(c, pb);

  const int threads = cuda ? 0 : cpu_threads_used(c.threads);
  const std::string mask =
      c.causal ? "causal"
      : (c.window_left >= 0 || c.window_right >= 0)
          ? "window(" + std::to_string(c.window_left) + "," + std::to_string(c.window_right) + ")"
          : "none";
  if (c.json) {
    std::printf("{");
    std::printf("\"device\": \"%s\", ", c.device.c_str());
    if (cuda) std::printf("\"gpu\": \"%s\", ", json_escape(gpu_name).c_str());
    std::printf(
        "\"batch\": %d, \"seqlen_q\": %d, \"seqlen_k\": %d, \"heads\": %d, \"heads_k\": %d, ",
        c.batch, c.seqlen_q, c.seqlen_k, c.heads, c.heads_k);
    std::printf("\"head_dim\": %d, \"head_dim_v\": %d, \"dtype\": \"%s\", ", c.head_dim,
                c.head_dim_v, dtype_short(c.dtype));
    std::printf("\"causal\": %s, \"window_left\": %d, \"window_right\": %d, \"mask\": \"%s\", ",
                c.causal ? "true" : "false", c.window_left, c.window_right, mask.c_str());
    std::printf("\"softcap\": %g, \"alibi\": %s, \"dropout\": %g, \"seed\": %llu, ", c.softcap,
                c.alibi ? "true" : "false", c.dropout, static_cast<unsigned long long>(c.seed));
    std::printf("\"threads\": %d, \"repeats\": %d, \"warmup\": %d, ", threads, c.repeats, c.warmup);
    std::printf(
        "\"fwd_flops\": %.6g, \"fwd_ms\": %.6g, \"fwd_ms_min\": %.6g, \"fwd_tflops\": %.6g, ",
        fwd_flops, fwd_med, fwd_min, tflops(fwd_flops, fwd_med));
    if (c.backward) {
      std::printf(
          "\"bwd_flops\": %.6g, \"bwd_ms\": %.6g, \"bwd_ms_min\": %.6g, \"bwd_tflops\": %.6g, ",
          bwd_flops, bwd_med, bwd_min, tflops(bwd_flops, bwd_med));
    } else {
      std::printf("\"bwd_ms\": null, ");
    }
    std::printf("\"check\": ");
    if (cmp.done) {
      std::printf("{\"compared\": \"%s\", \"max_abs_err_out\": %.6g, \"max_abs_err_lse\": %.6g, ",
                  json_escape(cmp.what).c_str(), cmp.max_err_out, cmp.max_err_lse);
      if (c.backward) {
        std::printf(
            "\"max_abs_err_dq\": %.6g, \"max_abs_err_dk\": %.6g, \"max_abs_err_dv\": %.6g, ",
            cmp.max_err_dq, cmp.max_err_dk, cmp.max_err_dv);
      }
      std::printf("\"nan\": %s, \"reference_fwd_ms_compared_part\": %.6g}, ",
                  cmp.nan ? "true" : "false", cmp.ref_forward_ms);
    } else {
      std::printf("%s, ",
                  c.check ? ("{\"compared\": \"" + json_escape(cmp.what) + "\"}").c_str() : "null");
    }
    if (c.reference_speed) {
      std::printf("\"reference_fwd_ms\": %.6g, \"speedup_vs_reference\": %.6g, ", ref_full_ms,
                  fwd_med > 0 ? ref_full_ms / fwd_med : 0.0);
    }
    std::printf("\"hostname\": \"%s\", \"cpu_model\": \"%s\", \"hardware_threads\": %u, ",
                json_escape(hostname()).c_str(), json_escape(cpu_model()).c_str(),
                std::thread::hardware_concurrency());
    std::printf("\"date_utc\": \"%s\", \"flashattn_version\": \"%s\"}\n", utc_now().c_str(),
                flashattn::version());
  } else {
    std::printf("flashattn %s  device %s%s%s  threads %d\n", flashattn::version(), c.device.c_str(),
                cuda ? " " : "", cuda ? gpu_name.c_str() : "", threads);
    std::printf("host %s  cpu %s  %s\n", hostname().c_str(), cpu_model().c_str(),
                utc_now().c_str());
    std::printf(
        "shape batch %d  seqlen_q %d  seqlen_k %d  heads %d/%d  head_dim %d/%d  %s  mask %s",
        c.batch, c.seqlen_q, c.seqlen_k, c.heads, c.heads_k, c.head_dim, c.head_dim_v,
        dtype_short(c.dtype), mask.c_str());
    if (c.softcap > 0) std::printf("  softcap %g", c.softcap);
    if (c.alibi) std::printf("  alibi");
    if (c.dropout > 0) std::printf("  dropout %g", c.dropout);
    std::printf("\n");
    std::printf("forward   %10.3f ms median (min %.3f, %d runs)  %8.3f TFLOP/s\n", fwd_med, fwd_min,
                c.repeats, tflops(fwd_flops, fwd_med));
    if (c.backward) {
      std::printf("backward  %10.3f ms median (min %.3f, %d runs)  %8.3f TFLOP/s\n", bwd_med,
                  bwd_min, c.repeats, tflops(bwd_flops, bwd_med));
    }
    if (c.check) {
      if (cmp.done) {
        std::printf("check vs float64 reference on %s:\n", cmp.what.c_str());
        std::printf("  max|err| out %.3g (max|ref| %.3g)  lse %.3g", cmp.max_err_out,
                    cmp.max_ref_out, cmp.max_err_lse);
        if (c.backward) {
          std::printf("  dq %.3g (%.3g)  dk %.3g (%.3g)  dv %.3g (%.3g)", cmp.max_err_dq,
                      cmp.max_ref_dq, cmp.max_err_dk, cmp.max_ref_dk, cmp.max_err_dv,
                      cmp.max_ref_dv);
        }
        std::printf("%s\n", cmp.nan ? "  NaN FOUND" : "");
        std::printf("  reference forward on that part: %.1f ms\n", cmp.ref_forward_ms);
      } else {
        std::printf("check: compared %s\n", cmp.what.c_str());
      }
    }
    if (c.reference_speed) {
      std::printf(
          "reference forward (float64, 1 thread) on the full shape: %.1f ms -> flashattn "
          "is %.1fx faster\n",
          ref_full_ms, fwd_med > 0 ? ref_full_ms / fwd_med : 0.0);
    }
  }
  return cmp.nan ? 1 : 0;
}
