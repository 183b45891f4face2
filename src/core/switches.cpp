#include "core/switches.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace flashattn::detail {
namespace {

constexpr int kCount = static_cast<int>(Switch::kCount);

// Each switch's environment variable and the value that turns it on (nullptr: any value that
// starts with '1'), in Switch order.
struct EnvRule {
  const char* variable;
  const char* value;
};
constexpr EnvRule kEnvRules[] = {
    {"FLASHATTN_SPLIT_COMBINE", "kernel"},          // kSplitCombineKernel
    {"FLASHATTN_SPLIT_COMBINE", "counter"},         // kSplitCombineCounter
    {"FLASHATTN_DEV_BWD_SINGLE_BUFFER", nullptr},   // kBwdSingleBuffer
    {"FLASHATTN_DEV_FWD_SM80", nullptr},            // kFwdSm80
    {"FLASHATTN_DEV_BWD_SM80", nullptr},            // kBwdSm80
    {"FLASHATTN_DEV_NO_TOKEN_FOLD", nullptr},       // kNoTokenFold
    {"FLASHATTN_DEV_NO_DECODE_FOLD", nullptr},      // kNoDecodeFold
    {"FLASHATTN_DEV_SM90_CACHE", nullptr},          // kSm90Cache
    {"FLASHATTN_DEV_DECODE_SHARE", nullptr},        // kDecodeShare
};
static_assert(sizeof(kEnvRules) / sizeof(kEnvRules[0]) == kCount, "one environment rule per switch");

// What the environment says, read at the switch's first use.
bool from_environment(Switch s) {
  const EnvRule& rule = kEnvRules[static_cast<int>(s)];
  const char* v = std::getenv(rule.variable);
  if (v == nullptr) return false;
  return rule.value != nullptr ? std::strcmp(v, rule.value) == 0 : v[0] == '1';
}

// -1: not read yet; 0 off; 1 on. Two threads reading an unread switch at once both read the
// same environment, so the race is benign.
std::atomic<int> g_state[kCount] = {-1, -1, -1, -1, -1, -1, -1, -1, -1};
static_assert(kCount == 9, "one initial state per switch");

std::atomic<unsigned long long> g_sm90_backward_calls{0};
std::atomic<unsigned long long> g_native_head_dim_v_backward_calls{0};
std::atomic<unsigned long long> g_split_cluster_launches{0};
std::atomic<unsigned long long> g_token_fold_calls{0};
std::atomic<unsigned long long> g_decode_share_calls{0};
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
unsigned long long decode_share_calls() { return g_decode_share_calls.load(std::memory_order_relaxed); }
void count_decode_share() { g_decode_share_calls.fetch_add(1, std::memory_order_relaxed); }

unsigned long long sm90_forward_calls() { return g_sm90_forward_calls.load(std::memory_order_relaxed); }
void count_sm90_forward() { g_sm90_forward_calls.fetch_add(1, std::memory_order_relaxed); }

unsigned long long sm90_mask_bits_calls() { return g_sm90_mask_bits_calls.load(std::memory_order_relaxed); }
void count_sm90_mask_bits() { g_sm90_mask_bits_calls.fetch_add(1, std::memory_order_relaxed); }

unsigned long long sm90_mask_kernel_calls() { return g_sm90_mask_kernel_calls.load(std::memory_order_relaxed); }
void count_sm90_mask_kernel() { g_sm90_mask_kernel_calls.fetch_add(1, std::memory_order_relaxed); }

}  // namespace flashattn::detail
