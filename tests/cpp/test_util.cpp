// Implementation of test_util.h except the naive low-precision emulation (naive_lowp.cpp).
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#if defined(FLASHATTN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace flashattn::test {

// ---- backends -------------------------------------------------------------------------------

const char* backend_name(Backend b) { return b == Backend::kCpu ? "cpu" : "cuda"; }

Device device_of(Backend b) {
  return b == Backend::kCpu ? Device{DeviceType::kCPU, 0} : Device{DeviceType::kCUDA, 0};
}

std::vector<Backend> all_backends() { return {Backend::kCpu, Backend::kCuda}; }

bool backend_available(Backend b) { return b == Backend::kCpu || cuda_available(); }

bool split_clusters_expected(long long ctas) {
#if defined(FLASHATTN_WITH_CUDA) && defined(FLASHATTN_TEST_CUDA_SM90)
  int major = 0, sms = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) return false;
  return major == 9 && ctas <= 2LL * sms;
#else
  (void)ctas;
  return false;
#endif
}

bool sm90_cache_expected(int head_dim) {
#if defined(FLASHATTN_WITH_CUDA) && defined(FLASHATTN_TEST_CUDA_SM90)
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return false;
  const char* path = std::getenv("FLASHATTN_CUDA_PATH");
  // The call runs at the narrowest built head dim >= head_dim (padded copies otherwise), and
  // reaches the cache kernel there when that is 64, 128 or 256.
  const int run = cuda_run_head_dim(head_dim, head_dim);
  return major == 9 && !(path != nullptr && std::string(path) == "sm80") && (run == 64 || run == 128 || run == 256);
#else
  (void)head_dim;
  return false;
#endif
}

// ---- element conversions --------------------------------------------------------------------

uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  // 65520 = halfway between the largest half (65504) and 2^16; it and above round to inf.
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half, in units of 2^-24
    float a;
    std::memcpy(&a, &abs, sizeof(a));
    const auto m = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));  // exact scaling
    return static_cast<uint16_t>(sign | m);
  }
  const uint32_t exp = (abs >> 23) - 127u + 15u;
  const uint32_t mant = abs & 0x7FFFFFu;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry bumps the exponent: right
  return static_cast<uint16_t>(sign | h);
}

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  uint32_t bits;
  if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15u + 127u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t float_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_bits_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

double round_to(DType dtype, double x) {
  const auto f = static_cast<float>(x);
  switch (dtype) {
    case DType::kFloat32:
      return f;
    case DType::kFloat16:
      return half_bits_to_float(float_to_half_bits(f));
    case DType::kBFloat16:
      return bf16_bits_to_float(float_to_bf16_bits(f));
    default:
      break;
  }
  throw std::invalid_argument("round_to: not a floating dtype");
}

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return std::ldexp(1.0, -24);
    case DType::kFloat16:
      return std::ldexp(1.0, -11);
    case DType::kBFloat16:
      return std::ldexp(1.0, -8);
    default:
      break;
  }
  throw std::invalid_argument("unit_roundoff: not a floating dtype");
}

// ---- device memory --------------------------------------------------------------------------

#if defined(FLASHATTN_WITH_CUDA)
namespace {
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(e));
  }
}
}  // namespace
#endif

constexpr std::align_val_t kHostAlign{64};

DeviceBuffer::DeviceBuffer(Backend backend, size_t bytes) : backend_(backend), bytes_(bytes) {
  // Never allocate 0 bytes: an empty tensor still gets a valid, distinct pointer.
  const size_t alloc = std::max<size_t>(bytes, 64);
  if (backend == Backend::kCpu) {
    ptr_ = ::operator new(alloc, kHostAlign);
    return;
  }
#if defined(FLASHATTN_WITH_CUDA)
  cuda_check(cudaMalloc(&ptr_, alloc), "cudaMalloc");
#else
  throw std::runtime_error("DeviceBuffer: this test build has no CUDA");
#endif
}

DeviceBuffer::~DeviceBuffer() {
  if (backend_ == Backend::kCpu) {
    ::operator delete(ptr_, kHostAlign);
    return;
  }
#if defined(FLASHATTN_WITH_CUDA)
  // A failing cudaFree cannot throw from a destructor; report it as a test failure.
  const cudaError_t e = cudaFree(ptr_);
  EXPECT_EQ(e, cudaSuccess) << "cudaFree: " << cudaGetErrorString(e);
#endif
}

void DeviceBuffer::upload(const void* src) {
  if (bytes_ == 0) return;
  if (backend_ == Backend::kCpu) {
    std::memcpy(ptr_, src, bytes_);
    return;
  }
#if defined(FLASHATTN_WITH_CUDA)
  cuda_check(cudaMemcpy(ptr_, src, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
#endif
}

void DeviceBuffer::download(void* dst) const {
  if (bytes_ == 0) return;
  if (backend_ == Backend::kCpu) {
    std::memcpy(dst, ptr_, bytes_);
    return;
  }
#if defined(FLASHATTN_WITH_CUDA)
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuda_check(cudaMemcpy(dst, ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
#endif
}

// ---- Arena ----------------------------------------------------------------------------------

namespace {
void store_nan(DType dtype, unsigned char* p) {
  switch (dtype) {
    case DType::kFloat32: {
      const float f = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kFloat16: {
      const uint16_t h = 0x7E00u;
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t h = 0x7FC0u;
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kInt32: {
      const int32_t i = std::numeric_limits<int32_t>::max();
      std::memcpy(p, &i, 4);
      break;
    }
    case DType::kFloat8E4M3:
      *p = 0x7Fu;
      break;
    case DType::kUInt8:
      *p = 0xA5u;  // not a boolean: a mask read where no view covers it shows up
      break;
  }
}
}  // namespace

Arena::Arena(Backend backend, DType dtype, int64_t numel)
    : backend_(backend),
      dtype_(dtype),
      numel_(numel),
      elem_size_(dtype_size(dtype)),
      image_(static_cast<size_t>(numel) * dtype_size(dtype)),
      covered_(static_cast<size_t>(numel), 0),
      buffer_(backend, static_cast<size_t>(numel) * dtype_size(dtype)) {
  for (int64_t i = 0; i < numel; ++i)
    store_nan(dtype, &image_[static_cast<size_t>(i) * elem_size_]);
}

void Arena::set(int64_t i, double v) {
  unsigned char* p = &image_.at(static_cast<size_t>(i) * elem_size_);
  switch (dtype_) {
    case DType::kFloat32: {
      const auto f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kFloat16: {
      const uint16_t h = float_to_half_bits(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t h = float_to_bf16_bits(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kInt32: {
      const auto n = static_cast<int32_t>(v);
      std::memcpy(p, &n, 4);
      break;
    }
    case DType::kFloat8E4M3:
      throw std::invalid_argument("Arena::set: float8 is not supported");
    case DType::kUInt8:
      *p = static_cast<unsigned char>(v);
      break;
  }
}

double Arena::get(int64_t i) const {
  const unsigned char* p = &image_.at(static_cast<size_t>(i) * elem_size_);
  switch (dtype_) {
    case DType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return half_bits_to_float(h);
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_bits_to_float(h);
    }
    case DType::kInt32: {
      int32_t n;
      std::memcpy(&n, p, 4);
      return n;
    }
    case DType::kUInt8:
      return *p;
    case DType::kFloat8E4M3:
      break;
  }
  throw std::invalid_argument("Arena::get: float8 is not supported");
}

void Arena::upload() {
  buffer_.upload(image_.data());
  uploaded_ = image_;
}

void Arena::download() { buffer_.download(image_.data()); }

testing::AssertionResult Arena::padding_untouched(const char* name) const {
  if (uploaded_.size() != image_.size()) {
    return testing::AssertionFailure() << name << ": arena was never uploaded";
  }
  int64_t changed = 0, first = -1;
  for (int64_t i = 0; i < numel_; ++i) {
    if (covered_[static_cast<size_t>(i)]) continue;
    const size_t at = static_cast<size_t>(i) * elem_size_;
    if (std::memcmp(&image_[at], &uploaded_[at], elem_size_) != 0) {
      if (first < 0) first = i;
      ++changed;
    }
  }
  if (changed == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure()
         << name << ": " << changed << " padding elements outside the view were written (first at "
         << "buffer element " << first << ")";
}

// ---- View -----------------------------------------------------------------------------------

int64_t View::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

int64_t View::element(int64_t linear) const {
  int64_t idx = offset;
  for (int d = ndim - 1; d >= 0; --d) {
    const int64_t c = linear % shape[d];
    linear /= shape[d];
    idx += c * strides[d];
  }
  return idx;
}

TensorView View::tensor() const {
  TensorView t;
  t.dtype = arena->dtype();
  t.device = device_of(arena->backend());
  t.data = static_cast<unsigned char*>(arena->device_data()) + offset * dtype_size(t.dtype);
  t.ndim = ndim;
  for (int i = 0; i < ndim; ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides[i];
  }
  return t;
}

namespace {
// Calls f(linear, arena_index) for every element in logical (row-major) order, stepping the
// multi-index like an odometer instead of dividing per element.
template <typename F>
void for_each_element(const View& v, F&& f) {
  const int64_t n = v.numel();
  if (n == 0) return;
  int64_t idx[4] = {0, 0, 0, 0};
  int64_t at = v.offset;
  for (int64_t linear = 0; linear < n; ++linear) {
    f(linear, at);
    for (int d = v.ndim - 1; d >= 0; --d) {
      at += v.strides[d];
      if (++idx[d] < v.shape[d]) break;
      at -= v.strides[d] * v.shape[d];
      idx[d] = 0;
    }
  }
}
}  // namespace

void View::write(const std::vector<double>& values) {
  if (static_cast<int64_t>(values.size()) != numel()) {
    throw std::invalid_argument("View::write: size mismatch");
  }
  for_each_element(*this,
                   [&](int64_t i, int64_t at) { arena->set(at, values[static_cast<size_t>(i)]); });
}

std::vector<double> View::read() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for_each_element(*this,
                   [&](int64_t i, int64_t at) { out[static_cast<size_t>(i)] = arena->get(at); });
  return out;
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous:
      return "contig";
    case Layout::kPadded:
      return "padded";
    case Layout::kPaddedOdd:
      return "padodd";
    case Layout::kHeadMajor:
      return "headmajor";
    case Layout::kPacked:
      return "packed";
  }
  return "?";
}

namespace {
// Marks every element of v as covered and returns it.
View finish_view(View v) {
  for_each_element(v, [&](int64_t, int64_t at) { v.arena->mark_covered(at); });
  return v;
}

int64_t extent(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return 0;
    last += (shape[i] - 1) * strides[i];
  }
  return last + 1;
}
}  // namespace

View alloc_view(Backend backend, DType dtype, Layout layout, const std::vector<int64_t>& shape) {
  const int r = static_cast<int>(shape.size());
  if (r < 1 || r > 4) throw std::invalid_argument("alloc_view: rank must be 1..4");
  std::vector<int64_t> strides(static_cast<size_t>(r));
  if (layout == Layout::kHeadMajor && r >= 3) {
    // Memory order: swap the (seqlen, heads) pair, i.e. dims r-3 and r-2.
    std::vector<int> order(static_cast<size_t>(r));
    for (int i = 0; i < r; ++i) order[static_cast<size_t>(i)] = i;
    std::swap(order[static_cast<size_t>(r - 3)], order[static_cast<size_t>(r - 2)]);
    int64_t s = 1;
    for (int i = r - 1; i >= 0; --i) {
      strides[static_cast<size_t>(order[static_cast<size_t>(i)])] = s;
      s *= shape[static_cast<size_t>(order[static_cast<size_t>(i)])];
    }
  } else {
    const int64_t pad = layout == Layout::kPadded ? 8 : layout == Layout::kPaddedOdd ? 3 : 0;
    strides[static_cast<size_t>(r - 1)] = 1;
    for (int i = r - 2; i >= 0; --i) {
      strides[static_cast<size_t>(i)] =
          shape[static_cast<size_t>(i + 1)] * strides[static_cast<size_t>(i + 1)] + pad;
    }
  }
  View v;
  // Padded layouts also leave a gap before the first element.
  v.offset = (layout == Layout::kPadded) ? 8 : (layout == Layout::kPaddedOdd) ? 3 : 0;
  v.arena = std::make_shared<Arena>(backend, dtype, v.offset + extent(shape, strides) + v.offset);
  v.ndim = r;
  for (int i = 0; i < r; ++i) {
    v.shape[i] = shape[static_cast<size_t>(i)];
    v.strides[i] = strides[static_cast<size_t>(i)];
  }
  return finish_view(v);
}

std::vector<View> alloc_packed(Backend backend, DType dtype, const std::vector<int64_t>& prefix,
                               const std::vector<int64_t>& heads, int64_t dim) {
  int64_t total_heads = 0;
  for (int64_t h : heads) total_heads += h;
  std::vector<int64_t> full = prefix;
  full.push_back(total_heads);
  full.push_back(dim);
  const int r = static_cast<int>(full.size());
  std::vector<int64_t> strides(static_cast<size_t>(r));
  int64_t s = 1;
  for (int i = r - 1; i >= 0; --i) {
    strides[static_cast<size_t>(i)] = s;
    s *= full[static_cast<size_t>(i)];
  }
  auto arena = std::make_shared<Arena>(backend, dtype, s);
  std::vector<View> views;
  int64_t head0 = 0;
  for (int64_t h : heads) {
    View v;
    v.arena = arena;
    v.offset = head0 * dim;
    v.ndim = r;
    for (int i = 0; i < r; ++i) {
      v.shape[i] = full[static_cast<size_t>(i)];
      v.strides[i] = strides[static_cast<size_t>(i)];
    }
    v.shape[r - 2] = h;
    views.push_back(finish_view(v));
    head0 += h;
  }
  return views;
}

flashattn_tensor to_c(const TensorView& t) {
  flashattn_tensor c;
  std::memset(&c, 0, sizeof(c));
  c.data = t.data;
  c.dtype = static_cast<int32_t>(t.dtype);
  c.device_type = static_cast<int32_t>(t.device.type);
  c.device_index = t.device.index;
  c.ndim = t.ndim;
  for (int i = 0; i < t.ndim; ++i) {
    c.shape[i] = t.shape[i];
    c.strides[i] = t.strides[i];
  }
  return c;
}

// ---- problems -------------------------------------------------------------------------------

ProblemSpec ProblemSpec::dense(DType dtype, int batch, int seqlen_q, int seqlen_k, int heads,
                               int heads_k, int head_dim, int head_dim_v) {
  ProblemSpec s;
  s.dtype = dtype;
  s.seqlens_q.assign(static_cast<size_t>(batch), seqlen_q);
  s.seqlens_k.assign(static_cast<size_t>(batch), seqlen_k);
  s.heads = heads;
  s.heads_k = heads_k;
  s.head_dim = head_dim;
  s.head_dim_v = head_dim_v;
  return s;
}

std::string ProblemSpec::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << (varlen ? " varlen" : " dense") << " seqlens_q=(";
  for (size_t i = 0; i < seqlens_q.size(); ++i) os << (i ? "," : "") << seqlens_q[i];
  os << ") seqlens_k=(";
  for (size_t i = 0; i < seqlens_k.size(); ++i) os << (i ? "," : "") << seqlens_k[i];
  os << ") heads=" << heads << "/" << heads_k << " d=" << head_dim << "/" << head_dim_v
     << " layout=" << layout_name(layout);
  if (softmax_scale > 0) os << " scale=" << softmax_scale;
  if (causal) os << " causal";
  if (window_left >= 0 || window_right >= 0) {
    os << " window=(" << window_left << "," << window_right << ")";
  }
  if (softcap > 0) os << " softcap=" << softcap;
  if (alibi != Alibi::kNone) os << (alibi == Alibi::kHeads ? " alibi(h)" : " alibi(b,h)");
  if (dropout_p > 0)
    os << " dropout=" << dropout_p << " seed=" << dropout_seed << " offset=" << dropout_offset;
  if (deterministic) os << " deterministic";
  if (num_threads > 0) os << " threads=" << num_threads;
  if (num_splits > 0) os << " splits=" << num_splits;
  if (sink != Sink::kNone) os << " sink=" << sink_name(sink);
  os << " data_seed=" << data_seed;
  return os.str();
}

HostProblem make_host_problem(const ProblemSpec& spec) {
  const int batch = spec.batch();
  if (spec.seqlens_k.size() != spec.seqlens_q.size()) {
    throw std::invalid_argument("ProblemSpec: seqlens_q and seqlens_k differ in length");
  }
  HostProblem p;
  reference::Shape& sh = p.shape;
  sh.batch = batch;
  sh.heads = spec.heads;
  sh.heads_k = spec.heads_k;
  sh.head_dim = spec.head_dim;
  sh.head_dim_v = spec.head_dim_v;
  sh.cu_seqlens_q.assign(1, 0);
  sh.cu_seqlens_k.assign(1, 0);
  p.cu_seqlens_q.assign(1, 0);
  p.cu_seqlens_k.assign(1, 0);
  for (int b = 0; b < batch; ++b) {
    sh.cu_seqlens_q.push_back(sh.cu_seqlens_q.back() + spec.seqlens_q[static_cast<size_t>(b)]);
    sh.cu_seqlens_k.push_back(sh.cu_seqlens_k.back() + spec.seqlens_k[static_cast<size_t>(b)]);
    p.cu_seqlens_q.push_back(static_cast<int32_t>(sh.cu_seqlens_q.back()));
    p.cu_seqlens_k.push_back(static_cast<int32_t>(sh.cu_seqlens_k.back()));
  }

  std::mt19937 gen(spec.data_seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](std::vector<double>& x, int64_t n, double scale) {
    x.resize(static_cast<size_t>(n));
    for (double& e : x) e = round_to(spec.dtype, scale * normal(gen));
  };
  fill(p.q, sh.total_q() * spec.heads * spec.head_dim, spec.q_scale);
  fill(p.k, sh.total_k() * spec.heads_k * spec.head_dim, 1.0);
  fill(p.v, sh.total_k() * spec.heads_k * spec.head_dim_v, 1.0);
  fill(p.dout, sh.total_q() * spec.heads * spec.head_dim_v, 1.0);

  reference::Options& o = p.opt;
  // The library computes the default scale in double and rounds it to float; so do we.
  const float scale = spec.softmax_scale > 0.0f
                          ? spec.softmax_scale
                          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.head_dim)));
  o.scale = scale;
  o.window_left = spec.window_left;
  o.window_right = spec.causal ? 0 : spec.window_right;
  o.softcap = spec.softcap;
  o.dropout_p = spec.dropout_p;
  o.seed = spec.dropout_seed;
  o.offset = spec.dropout_offset;
  if (spec.alibi != Alibi::kNone) {
    std::uniform_real_distribution<float> slope(0.01f, 0.5f);
    if (spec.alibi == Alibi::kHeads) {
      // The usual geometric ALiBi slopes 2^(-8 (h + 1) / heads).
      for (int h = 0; h < spec.heads; ++h) {
        p.alibi.push_back(
            std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(spec.heads)));
      }
      for (int b = 0; b < batch; ++b) o.alibi.insert(o.alibi.end(), p.alibi.begin(), p.alibi.end());
    } else {
      for (int i = 0; i < batch * spec.heads; ++i) p.alibi.push_back(slope(gen));
      o.alibi.assign(p.alibi.begin(), p.alibi.end());
    }
  }
  if (spec.sink != Sink::kNone) {
    // Its own stream, so that adding a sink leaves the other inputs of a case unchanged.
    std::mt19937 sink_gen(spec.data_seed ^ 0x5EEDu);
    std::normal_distribution<float> around(0.5f, 1.5f);
    std::uniform_real_distribution<float> large(4.0f, 8.0f), huge(100.0f, 110.0f);
    for (int h = 0; h < spec.heads; ++h) {
      float x = -std::numeric_limits<float>::infinity();
      if (spec.sink == Sink::kRandom) x = (spec.heads >= 3 && h == 1) ? x : around(sink_gen);
      if (spec.sink == Sink::kLarge) x = large(sink_gen);
      if (spec.sink == Sink::kHuge) x = huge(sink_gen);
      p.sink.push_back(x);
    }
    o.sink.assign(p.sink.begin(), p.sink.end());
  }
  return p;
}

const char* sink_name(Sink s) {
  switch (s) {
    case Sink::kNone:
      return "none";
    case Sink::kRandom:
      return "random";
    case Sink::kLarge:
      return "large";
    case Sink::kHuge:
      return "huge";
    case Sink::kNegInf:
      return "neginf";
  }
  return "?";
}

std::vector<float> sink_logits(int heads, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> around(0.5f, 1.5f);
  std::uniform_real_distribution<float> large(4.0f, 8.0f);
  std::vector<float> sink;
  for (int h = 0; h < heads; ++h) {
    if (h % 4 == 1) sink.push_back(-std::numeric_limits<float>::infinity());
    else if (h % 4 == 2) sink.push_back(large(g));
    else sink.push_back(around(g));
  }
  return sink;
}

Results run_reference(const HostProblem& p, bool with_backward) {
  const reference::Shape& s = p.shape;
  Results r;
  r.out.resize(static_cast<size_t>(s.total_q() * s.heads * s.head_dim_v));
  r.lse.resize(static_cast<size_t>(s.heads * s.total_q()));
  reference::forward(s, p.opt, p.q.data(), p.k.data(), p.v.data(), r.out.data(), r.lse.data());
  if (with_backward) {
    r.dq.resize(p.q.size());
    r.dk.resize(p.k.size());
    r.dv.resize(p.v.size());
    if (!p.sink.empty()) r.dsink.resize(static_cast<size_t>(s.heads));
    reference::backward(s, p.opt, p.q.data(), p.k.data(), p.v.data(), p.dout.data(), r.dq.data(),
                        r.dk.data(), r.dv.data(), p.sink.empty() ? nullptr : r.dsink.data());
  }
  return r;
}

// ---- DeviceProblem --------------------------------------------------------------------------

DeviceProblem::DeviceProblem(Backend backend, const ProblemSpec& spec, const HostProblem& host)
    : backend_(backend), spec_(spec), host_(host) {
  const reference::Shape& s = host.shape;
  const bool varlen = spec.varlen;
  if (!varlen) {
    for (size_t b = 1; b < spec.seqlens_q.size(); ++b) {
      if (spec.seqlens_q[b] != spec.seqlens_q[0] || spec.seqlens_k[b] != spec.seqlens_k[0]) {
        throw std::invalid_argument("dense ProblemSpec needs equal sequence lengths");
      }
    }
  }
  const int64_t B = s.batch;
  // Dense: the common sequence lengths; varlen: the token totals.
  const int64_t Sq = varlen ? s.total_q() : spec.seqlens_q.at(0);
  const int64_t Sk = varlen ? s.total_k() : spec.seqlens_k.at(0);
  const int64_t H = s.heads, Hk = s.heads_k, D = s.head_dim, Dv = s.head_dim_v;
  // Row prefix: dense (batch, seqlen), varlen (total).
  const std::vector<int64_t> pq = varlen ? std::vector<int64_t>{Sq} : std::vector<int64_t>{B, Sq};
  const std::vector<int64_t> pk = varlen ? std::vector<int64_t>{Sk} : std::vector<int64_t>{B, Sk};
  auto shape = [](std::vector<int64_t> prefix, int64_t heads, int64_t dim) {
    prefix.push_back(heads);
    prefix.push_back(dim);
    return prefix;
  };
  const DType dt = spec.dtype;
  const Layout lay = spec.layout;

  if (lay == Layout::kPacked && D == Dv) {
    const bool same_rows = host.cu_seqlens_q == host.cu_seqlens_k;
    if (same_rows) {
      auto qkv = alloc_packed(backend, dt, pq, {H, Hk, Hk}, D);
      q_ = qkv[0], k_ = qkv[1], v_ = qkv[2];
      auto dqkv = alloc_packed(backend, dt, pq, {H, Hk, Hk}, D);
      dq_ = dqkv[0], dk_ = dqkv[1], dv_ = dqkv[2];
    } else {
      auto kv = alloc_packed(backend, dt, pk, {Hk, Hk}, D);
      k_ = kv[0], v_ = kv[1];
      auto dkv = alloc_packed(backend, dt, pk, {Hk, Hk}, D);
      dk_ = dkv[0], dv_ = dkv[1];
      q_ = alloc_view(backend, dt, Layout::kPadded, shape(pq, H, D));
      dq_ = alloc_view(backend, dt, Layout::kPadded, shape(pq, H, D));
    }
    out_ = alloc_view(backend, dt, Layout::kPadded, shape(pq, H, Dv));
    dout_ = alloc_view(backend, dt, Layout::kPadded, shape(pq, H, Dv));
  } else {
    const Layout l = lay == Layout::kPacked ? Layout::kPadded : lay;
    q_ = alloc_view(backend, dt, l, shape(pq, H, D));
    k_ = alloc_view(backend, dt, l, shape(pk, Hk, D));
    v_ = alloc_view(backend, dt, l, shape(pk, Hk, Dv));
    out_ = alloc_view(backend, dt, l, shape(pq, H, Dv));
    dout_ = alloc_view(backend, dt, l, shape(pq, H, Dv));
    dq_ = alloc_view(backend, dt, l, shape(pq, H, D));
    dk_ = alloc_view(backend, dt, l, shape(pk, Hk, D));
    dv_ = alloc_view(backend, dt, l, shape(pk, Hk, Dv));
  }
  const bool padded = lay == Layout::kPadded || lay == Layout::kPaddedOdd || lay == Layout::kPacked;
  const Layout aux = lay == Layout::kPaddedOdd ? Layout::kPaddedOdd
                     : padded                  ? Layout::kPadded
                                               : Layout::kContiguous;
  lse_ = alloc_view(backend, DType::kFloat32, aux,
                    varlen ? std::vector<int64_t>{H, Sq} : std::vector<int64_t>{B, H, Sq});
  if (spec.alibi == Alibi::kHeads) {
    alibi_ = alloc_view(backend, DType::kFloat32, Layout::kContiguous, {H});
  } else if (spec.alibi == Alibi::kBatchHeads) {
    alibi_ = alloc_view(backend, DType::kFloat32, aux, {B, H});
  }
  if (spec.sink != Sink::kNone) {
    sink_ = alloc_view(backend, DType::kFloat32, Layout::kContiguous, {H});
    dsink_ = alloc_view(backend, DType::kFloat32, aux, {H});
  }
  if (varlen) {
    cu_q_ = alloc_view(backend, DType::kInt32, Layout::kContiguous, {B + 1});
    cu_k_ = alloc_view(backend, DType::kInt32, Layout::kContiguous, {B + 1});
    cu_q_.write(std::vector<double>(host.cu_seqlens_q.begin(), host.cu_seqlens_q.end()));
    cu_k_.write(std::vector<double>(host.cu_seqlens_k.begin(), host.cu_seqlens_k.end()));
  }

  q_.write(host.q);
  k_.write(host.k);
  v_.write(host.v);
  dout_.write(host.dout);
  if (alibi_.defined()) alibi_.write(std::vector<double>(host.alibi.begin(), host.alibi.end()));
  if (sink_.defined()) sink_.write(std::vector<double>(host.sink.begin(), host.sink.end()));

  // Upload each distinct arena once (packed views share one).
  std::set<Arena*> done;
  for (const View* v :
       {&q_, &k_, &v_, &out_, &lse_, &dout_, &dq_, &dk_, &dv_, &alibi_, &cu_q_, &cu_k_, &sink_,
        &dsink_}) {
    if (v->defined() && done.insert(v->arena.get()).second) v->arena->upload();
  }
}

namespace {
template <typename Args>
void fill_options(const ProblemSpec& spec, const View& alibi, const View& cu_q, const View& cu_k,
                  Args* a) {
  a->softmax_scale = spec.softmax_scale;
  a->causal = spec.causal;
  a->window_left = spec.window_left;
  a->window_right = spec.window_right;
  a->softcap = spec.softcap;
  if (alibi.defined()) a->alibi_slopes = alibi.tensor();
  a->dropout_p = spec.dropout_p;
  a->seed = spec.dropout_seed;
  a->offset = spec.dropout_offset;
  a->num_threads = spec.num_threads;
  if (cu_q.defined()) {
    a->cu_seqlens_q = cu_q.tensor();
    a->cu_seqlens_k = cu_k.tensor();
    int mq = 0, mk = 0;
    for (int x : spec.seqlens_q) mq = std::max(mq, x);
    for (int x : spec.seqlens_k) mk = std::max(mk, x);
    // CUDA needs them; on the CPU leave 0 half the time to exercise "read from cu_seqlens".
    const bool give = cu_q.arena->backend() == Backend::kCuda || (spec.data_seed & 1u);
    a->max_seqlen_q = give ? std::max(mq, 1) : 0;
    a->max_seqlen_k = give ? std::max(mk, 1) : 0;
    a->check_cu_seqlens = true;
  }
}
}  // namespace

ForwardArgs DeviceProblem::forward_args() const {
  ForwardArgs a;
  fill_options(spec_, alibi_, cu_q_, cu_k_, &a);
  a.q = q_.tensor();
  a.k = k_.tensor();
  a.v = v_.tensor();
  a.out = out_.tensor();
  a.lse = lse_.tensor();
  a.num_splits = spec_.num_splits;
  if (sink_.defined()) a.learnable_sink = sink_.tensor();
  return a;
}

BackwardArgs DeviceProblem::backward_args() const {
  BackwardArgs a;
  fill_options(spec_, alibi_, cu_q_, cu_k_, &a);
  a.q = q_.tensor();
  a.k = k_.tensor();
  a.v = v_.tensor();
  a.out = out_.tensor();
  a.dout = dout_.tensor();
  a.lse = lse_.tensor();
  a.dq = dq_.tensor();
  a.dk = dk_.tensor();
  a.dv = dv_.tensor();
  a.deterministic = spec_.deterministic;
  if (sink_.defined()) {
    a.learnable_sink = sink_.tensor();
    a.dsink = dsink_.tensor();
  }
  return a;
}

void DeviceProblem::download_forward() {
  out_.arena->download();
  lse_.arena->download();
}

void DeviceProblem::download_backward() {
  std::set<Arena*> done;
  for (const View* v : {&dq_, &dk_, &dv_, &dsink_}) {
    if (v->defined() && done.insert(v->arena.get()).second) v->arena->download();
  }
}

std::vector<double> DeviceProblem::lse() const {
  std::vector<double> ours = lse_.read();
  if (spec_.varlen) return ours;  // (heads, total_q) already
  // (batch, heads, seqlen_q) -> (heads, batch * seqlen_q)
  const int64_t B = host_.shape.batch, H = host_.shape.heads;
  const int64_t Sq = lse_.shape[2];
  std::vector<double> r(ours.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Sq; ++i)
        r[static_cast<size_t>(h * B * Sq + b * Sq + i)] =
            ours[static_cast<size_t>((b * H + h) * Sq + i)];
  return r;
}

std::vector<unsigned char> DeviceProblem::grad_bytes() const {
  std::vector<unsigned char> bytes;
  std::set<Arena*> done;
  for (const View* v : {&dq_, &dk_, &dv_, &dsink_}) {
    if (v->defined() && done.insert(v->arena.get()).second) {
      bytes.insert(bytes.end(), v->arena->bytes().begin(), v->arena->bytes().end());
    }
  }
  return bytes;
}

testing::AssertionResult DeviceProblem::outputs_padding_untouched() const {
  const struct {
    const char* name;
    const View& v;
  } outs[] = {{"out", out_}, {"lse", lse_}, {"dq", dq_}, {"dk", dk_}, {"dv", dv_}, {"dsink", dsink_}};
  for (const auto& o : outs) {
    if (!o.v.defined()) continue;
    if (auto r = o.v.arena->padding_untouched(o.name); !r) return r;
  }
  return testing::AssertionSuccess();
}

// ---- acceptance criterion -------------------------------------------------------------------

ErrorStats error_stats(const std::vector<double>& ours, const std::vector<double>& ref) {
  ErrorStats st;
  double sum = 0.0;
  int64_t n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double err;
    if (std::isnan(ours[i])) {
      ++st.nan_count;
      err = std::numeric_limits<double>::infinity();
    } else if (std::isinf(ref[i]) || std::isinf(ours[i])) {
      err = ours[i] == ref[i] ? 0.0 : std::numeric_limits<double>::infinity();
    } else {
      err = std::fabs(ours[i] - ref[i]);
      sum += err;
      ++n;
    }
    if (err > st.max_abs || st.worst < 0) {
      st.max_abs = err;
      st.worst = static_cast<int64_t>(i);
    }
  }
  st.mean_abs = n > 0 ? sum / static_cast<double>(n) : 0.0;
  return st;
}

double grad_magnitude(const Results& ref) {
  return std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x) {
    if (std::isfinite(e)) m = std::max(m, std::fabs(e));
  }
  return m;
}

testing::AssertionResult meets_criterion(const std::string& what, DType dtype,
                                         const std::vector<double>& ours,
                                         const std::vector<double>& ref,
                                         const std::vector<double>& lowp, double magnitude) {
  if (ours.size() != ref.size()) {
    return testing::AssertionFailure()
           << what << ": " << ours.size() << " values, reference has " << ref.size();
  }
  const double ref_max = std::max(max_abs(ref), magnitude);
  const ErrorStats st = error_stats(ours, ref);
  double bound;
  std::ostringstream why;
  if (dtype == DType::kFloat32 || lowp.empty()) {
    bound = 1e-4 * ref_max + 1e-6;
    why << "1e-4 * max(max|ref|, magnitude) (" << ref_max << ") + 1e-6";
  } else {
    if (lowp.size() != ref.size()) {
      return testing::AssertionFailure() << what << ": naive_lowp has " << lowp.size()
                                         << " values, reference has " << ref.size();
    }
    const ErrorStats lo = error_stats(lowp, ref);
    const double atol = 2.0 * unit_roundoff(dtype) * (ref_max + 0.3);
    bound = 2.0 * lo.max_abs + atol;
    why << "2 * max|naive_lowp - ref| (" << lo.max_abs << ", mean " << lo.mean_abs << ") + atol ("
        << atol << ")";
  }
  if (st.nan_count == 0 && st.max_abs <= bound) return testing::AssertionSuccess();
  auto f = testing::AssertionFailure();
  f << what << ": max|ours - ref| = " << st.max_abs << " > bound " << bound << " = " << why.str()
    << "; mean|ours - ref| = " << st.mean_abs << "; NaN count = " << st.nan_count;
  if (st.worst >= 0) {
    f << "; worst at flat index " << st.worst << ": ours " << ours[static_cast<size_t>(st.worst)]
      << ", ref " << ref[static_cast<size_t>(st.worst)];
  }
  return f;
}

namespace {
std::vector<std::string> split_list(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = s; *p; ++p) {
    if (*p == ';' || *p == ',' || *p == ' ') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += *p;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}
}  // namespace

#if !defined(FLASHATTN_TEST_CUDA_HEAD_DIMS)
#define FLASHATTN_TEST_CUDA_HEAD_DIMS "32;64;96;128;192;256;576"
#endif
#if !defined(FLASHATTN_TEST_CUDA_DTYPES)
#define FLASHATTN_TEST_CUDA_DTYPES "fp16;bf16"
#endif

int cuda_run_head_dim(int head_dim, int head_dim_v) {
  const int widest = std::max(head_dim, head_dim_v);
  int run_dim = 0;
  for (const std::string& d : split_list(FLASHATTN_TEST_CUDA_HEAD_DIMS)) {
    const int built = std::stoi(d);
    if (built > 256) continue;  // 576: the MLA decode kernel only (forward_kvcache at 576 / 512)
    if (built >= widest && (run_dim == 0 || built < run_dim)) run_dim = built;
  }
  return run_dim;
}

bool cuda_may_not_support(const ProblemSpec& spec) {
  if (spec.dtype != DType::kFloat16 && spec.dtype != DType::kBFloat16) return true;
  // A call runs at D = cuda_run_head_dim(head_dim, head_dim_v); the operands of the side whose
  // width is not D (q, k / v, out) go through a padding copy that takes any strides, those of a
  // side whose width is D are read directly and need 16-byte aligned rows.
  const int run_dim = cuda_run_head_dim(spec.head_dim, spec.head_dim_v);
  if (run_dim == 0) return true;
  if (spec.layout == Layout::kPaddedOdd && (run_dim == spec.head_dim || run_dim == spec.head_dim_v)) {
    return true;
  }
  return !cuda_dtype_built(spec.dtype);
}

bool cuda_dtype_built(DType dtype) {
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16) return false;
  const auto types = split_list(FLASHATTN_TEST_CUDA_DTYPES);
  const char* mine = dtype == DType::kFloat16 ? "fp16" : "bf16";
  return std::find(types.begin(), types.end(), mine) != types.end();
}

namespace {
// True when `s` means "skip this case"; otherwise records a failure if `s` is an error.
bool handle_status(const char* what, Backend backend, const ProblemSpec& spec, const Status& s,
                   CaseOutcome* oc) {
  if (s.ok()) return false;
  if (backend == Backend::kCuda && s.code() == StatusCode::kNotSupported &&
      cuda_may_not_support(spec)) {
    oc->skipped = true;
    oc->skip_reason = std::string(what) + ": " + s.message();
    return true;
  }
  ADD_FAILURE() << what << " on " << backend_name(backend) << " failed with "
                << status_code_name(s.code()) << ": " << s.message()
                << "\n  case: " << spec.describe();
  return true;
}
}  // namespace

CaseOutcome check_problem(Backend backend, const ProblemSpec& spec, bool with_backward) {
  CaseOutcome oc;
  if (!backend_available(backend)) {
    oc.skipped = true;
    oc.skip_reason = "no CUDA device";
    return oc;
  }
  const HostProblem host = make_host_problem(spec);
  DeviceProblem dev(backend, spec, host);
  if (handle_status("forward", backend, spec, forward(dev.forward_args()), &oc)) return oc;
  dev.download_forward();

  const Results ref = run_reference(host, with_backward);
  Results low;
  if (spec.dtype != DType::kFloat32) low = run_naive_lowp(host, spec.dtype, with_backward);
  const std::string where = "\n  case: " + spec.describe();
  EXPECT_TRUE(meets_criterion("out", spec.dtype, dev.out(), ref.out, low.out)) << where;
  EXPECT_TRUE(meets_criterion("lse", spec.dtype, dev.lse(), ref.lse, low.lse)) << where;

  if (with_backward) {
    if (handle_status("backward", backend, spec, backward(dev.backward_args()), &oc)) return oc;
    dev.download_backward();
    const double g = grad_magnitude(ref);
    EXPECT_TRUE(meets_criterion("dq", spec.dtype, dev.dq(), ref.dq, low.dq, g)) << where;
    EXPECT_TRUE(meets_criterion("dk", spec.dtype, dev.dk(), ref.dk, low.dk, g)) << where;
    EXPECT_TRUE(meets_criterion("dv", spec.dtype, dev.dv(), ref.dv, low.dv, g)) << where;
    if (spec.sink != Sink::kNone) {
      EXPECT_TRUE(meets_criterion("dsink", spec.dtype, dev.dsink(), ref.dsink, low.dsink)) << where;
    }
  } else {
    dev.download_backward();  // the gradient buffers must still be untouched (all NaN)
  }
  EXPECT_TRUE(dev.outputs_padding_untouched()) << where;
  return oc;
}

}  // namespace flashattn::test
