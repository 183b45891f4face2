#include "core/switches.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace flashattn::detail {
namespace {

constexpr int kCount = static_cast<int>(Switch::kCount);

// What the environment says, read at the switch's first use.
bool from_environment(Switch s) {
  switch (s) {
    case Switch::kSplitCombineKernel: {
      const char* v = std::getenv("FLASHATTN_SPLIT_COMBINE");
      return v != nullptr && std::strcmp(v, "kernel") == 0;
    }
    case Switch::kSplitCombineCounter: {
      const char* v = std::getenv("FLASHATTN_SPLIT_COMBINE");
      return v != nullptr && std::strcmp(v, "counter") == 0;
    }
    case Switch::kBwdSingleBuffer: {
      const char* v = std::getenv("FLASHATTN_DEV_BWD_SINGLE_BUFFER");
      return v != nullptr && v[0] == '1';
    }
    case Switch::kFwdSm80: {
      const char* v = std::getenv("FLASHATTN_DEV_FWD_SM80");
      return v != nullptr && v[0] == '1';
    }
    case Switch::kBwdSm80: {
      const char* v = std::getenv("FLASHATTN_DEV_BWD_SM80");
      return v != nullptr && v[0] == '1';
    }
    case Switch::kNoTokenFold: {
      const char* v = std::getenv("FLASHATTN_DEV_NO_TOKEN_FOLD");
      return v != nullptr && v[0] == '1';
    }
    case Switch::kNoDecodeFold: {
      const char* v = std::getenv("FLASHATTN_DEV_NO_DECODE_FOLD");
      return v != nullptr && v[0] == '1';
    }
    case Switch::kCount:
      break;
  }
  return false;
}

// -1: not read yet; 0 off; 1 on. Two threads reading an unread switch at once both read the
// same environment, so the race is benign.
std::atomic<int> g_state[kCount] = {-1, -1, -1, -1, -1, -1, -1};
static_assert(kCount == 7, "one initial state per switch");

std::atomic<unsigned long long> g_sm90_backward_calls{0};
std::atomic<unsigned long long> g_native_head_dim_v_backward_calls{0};
std::atomic<unsigned long long> g_split_cluster_launches{0};
std::atomic<unsigned long long> g_token_fold_calls{0};
std::atomic<unsigned long long> g_sm90_forward_calls{0};
std::atomic<unsigned long long> g_sm90_mask_bits_calls{0};
std::atomic<unsigned long long> g_sm90_mask_kernel_calls{0};

}  // namespace

bool switch_on(Switch s) {
  std::atomic<int>& state = g_state[static_cast<int>(s)];
  int v = state.load(std::memory_order_relaxed);
  if (v < 0) {
    v = from_environment(s) ? 1 : 0;
    state.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_switch(Switch s, bool on) { g_state[static_cast<int>(s)].store(on ? 1 : 0, std::memory_order_relaxed); }

unsigned long long sm90_backward_calls() { return g_sm90_backward_calls.load(std::memory_order_relaxed); }
void count_sm90_backward() { g_sm90_backward_calls.fetch_add(1, std::memory_order_relaxed); }

unsigned long long native_head_dim_v_backward_calls() {
  return g_native_head_dim_v_backward_calls.load(std::memory_order_relaxed);
}
void count_native_head_dim_v_backward() { g_native_head_dim_v_backward_calls.fetch_add(1, std::memory_order_relaxed); }

unsigned long long split_cluster_launches() { return g_split_cluster_launches.load(std::memory_order_relaxed); }
void count_split_cluster_launch() { g_split_cluster_launches.fetch_add(1, std::memory_order_relaxed); }

unsigned long long token_fold_calls() { return g_token_fold_calls.load(std::memory_order_relaxed); }
void count_token_fold() { g_token_fold_calls.fetch_add(1, std::memory_order_relaxed); }

unsigned long long sm90_forward_calls() { return g_sm90_forward_calls.load(std::memory_order_relaxed); }
void count_sm90_forward() { g_sm90_forward_calls.fetch_add(1, std::memory_order_relaxed); }

unsigned long long sm90_mask_bits_calls() { return g_sm90_mask_bits_calls.load(std::memory_order_relaxed); }
void count_sm90_mask_bits() { g_sm90_mask_bits_calls.fetch_add(1, std::memory_order_relaxed); }

unsigned long long sm90_mask_kernel_calls() { return g_sm90_mask_kernel_calls.load(std::memory_order_relaxed); }
void count_sm90_mask_kernel() { g_sm90_mask_kernel_calls.fetch_add(1, std::memory_order_relaxed); }

}  // namespace flashattn::detail
