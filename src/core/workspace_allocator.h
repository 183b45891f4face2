// The application's workspace allocator (flashattn::set_workspace_allocator), as the CUDA
// backend's workspace_alloc / workspace_free (cuda/common/workspace.h) use it.
#pragma once

#include <cstddef>

namespace flashattn::detail {

// Whether an allocator is installed that takes workspaces of `bytes` (>= its min_bytes).
bool hook_takes(size_t bytes);

// `bytes` from the installed allocator when it takes them, else (or when it returned nullptr or a
// block that is not 256-byte aligned, which goes back to it) nullptr. A pointer it returns is
// remembered with the allocator's release and context.
void* hooked_allocate(size_t bytes, void* stream);

// When `ptr` came from hooked_allocate: hands it to that allocator's release on `stream`,
// forgets it and returns true. Otherwise false (the pool's memory).
bool hooked_release(void* ptr, void* stream);

}  // namespace flashattn::detail
