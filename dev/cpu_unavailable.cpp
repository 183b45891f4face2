// Dev-harness only: lets dev/build.sh link the CUDA path before the CPU backend is present.
#include "core/backend.h"

namespace flashattn {
Status cpu_forward(const ForwardParams&) { return Status::NotSupported("cpu backend not linked in this dev build"); }
Status cpu_backward(const BackwardParams&) { return Status::NotSupported("cpu backend not linked in this dev build"); }
}  // namespace flashattn
