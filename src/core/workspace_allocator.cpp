// flashattn::set_workspace_allocator and the bookkeeping of the blocks it hands out.
#include "core/workspace_allocator.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "flashattn/flashattn.h"

namespace flashattn {
namespace {

struct Release {
  void (*release)(void*, void*, void*);
  void* context;
};

std::mutex g_mutex;
WorkspaceAllocator g_allocator;                    // guarded by g_mutex
std::atomic<bool> g_installed{false};             // g_allocator.allocate != nullptr
std::atomic<size_t> g_min_bytes{0};               // g_allocator.min_bytes
std::atomic<size_t> g_live{0};                    // blocks in g_blocks
std::unordered_map<void*, Release> g_blocks;      // guarded by g_mutex

}  // namespace

WorkspaceAllocator set_workspace_allocator(const WorkspaceAllocator& allocator) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const WorkspaceAllocator previous = g_allocator;
  g_allocator = allocator;
  if (allocator.allocate == nullptr || allocator.release == nullptr) g_allocator = WorkspaceAllocator{};
  g_min_bytes.store(g_allocator.min_bytes, std::memory_order_relaxed);
  g_installed.store(g_allocator.allocate != nullptr, std::memory_order_release);
  return previous;
}

namespace detail {

bool hook_takes(size_t bytes) {
  return g_installed.load(std::memory_order_acquire) && bytes >= g_min_bytes.load(std::memory_order_relaxed);
}

void* hooked_allocate(size_t bytes, void* stream) {
  if (!g_installed.load(std::memory_order_acquire)) return nullptr;
  WorkspaceAllocator a;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    a = g_allocator;
  }
  if (a.allocate == nullptr || bytes < a.min_bytes) return nullptr;
  void* ptr = a.allocate(bytes, stream, a.context);  // outside the lock: it may take long
  if (ptr == nullptr) return nullptr;
  if (reinterpret_cast<uintptr_t>(ptr) % 256 != 0) {  // the workspaces' carving assumes 256 bytes
    a.release(ptr, stream, a.context);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_blocks[ptr] = Release{a.release, a.context};
  g_live.fetch_add(1, std::memory_order_relaxed);
  return ptr;
}

bool hooked_release(void* ptr, void* stream) {
  if (ptr == nullptr || g_live.load(std::memory_order_relaxed) == 0) return false;
  Release r{};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto it = g_blocks.find(ptr);
    if (it == g_blocks.end()) return false;
    r = it->second;
    g_blocks.erase(it);
    g_live.fetch_sub(1, std::memory_order_relaxed);
  }
  r.release(ptr, stream, r.context);
  return true;
}

}  // namespace detail
}  // namespace flashattn
