// What the two halves of the extension share: module.cpp (DLPack arrays of any framework)
// and torch_path.cpp (torch tensors read directly). Errors travel to Python as values.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "flashattn/flashattn.h"

namespace nb = nanobind;
namespace fa = flashattn;

namespace flashattn_py {

// An error for Python: the name of the exception class and its message. The entry points return
// it (as a (name, message) tuple; None on success) and flashattn._lowlevel raises it, so no C++
// exception crosses the binding. (An earlier crash blamed on exceptions here turned out to be
// the exported static libstdc++; python/src/exports.map fixes that.)
struct Error {
  const char* kind = nullptr;  // "ValueError", "TypeError", "NotImplementedError", "RuntimeError"
  std::string message;
  explicit operator bool() const { return kind != nullptr; }
};

inline nb::object to_python(const Error& e) {
  if (!e) return nb::none();
  return nb::make_tuple(nb::str(e.kind), nb::str(e.message.c_str(), e.message.size()));
}

// Status -> Error. A message about a dtype is a TypeError whatever the code (this covers "k must
// have dtype float16, got float32" and "q has dtype float32; supported: ..."). Otherwise:
// kInvalidArgument -> ValueError, kNotSupported -> NotImplementedError (a valid request this
// build/backend/GPU cannot run; a subclass of RuntimeError), kCudaError and kInternal ->
// RuntimeError.
inline Error status_error(const fa::Status& s) {
  const std::string& m = s.message();
  const bool about_dtype = m.find("dtype") != std::string::npos;
  switch (s.code()) {
    case fa::StatusCode::kOk: return {};
    case fa::StatusCode::kInvalidArgument: return {about_dtype ? "TypeError" : "ValueError", m};
    case fa::StatusCode::kNotSupported: return {about_dtype ? "TypeError" : "NotImplementedError", m};
    case fa::StatusCode::kCudaError: return {"RuntimeError", "CUDA error: " + m};
    case fa::StatusCode::kInternal: return {"RuntimeError", "flashattn internal error (please report): " + m};
  }
  return {"RuntimeError",
          "flashattn: unexpected status code " + std::to_string(static_cast<int>(s.code())) + ": " + m};
}

// Runs a library call with the GIL released (it may wait on the device or run CPU threads) and
// returns its outcome as to_python does.
template <typename Call>
nb::object run_released(const Call& call) {
  fa::Status s;
  {
    nb::gil_scoped_release release;
    s = call();
  }
  return to_python(status_error(s));
}

// Registers the torch fast path's entry points (torch_path.cpp).
void register_torch_path(nb::module_& m);

}  // namespace flashattn_py
