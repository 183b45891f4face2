// The application's workspace allocator (flashattn::set_workspace_allocator), as the CUDA
// backend's workspace_alloc / workspace_free (cuda/common/workspace.h) use it.
#pragma once

#include <cstddef>

namespace flashattn::detail {

// `bytes` from the installed allocator when there is one and `bytes` >= its min_bytes, else (or
// when it returned nullptr) nullptr. A pointer it returns is remembered with the allocator's
// release and context.
void* hooked_allocate(size_t bytes, void* stream);

// When `ptr` came from hooked_allocate: hands it to that allocator's release on `stream`,
// forgets it and returns true. Otherwise false (the pool's memory).
bool hooked_release(void* ptr, void* stream);

}  // namespace flashattn::detail
