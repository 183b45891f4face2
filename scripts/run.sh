#!/usr/bin/env bash
# Builds flashattn-bench and runs it at its default size on the best device present
# (CUDA when available, else the CPU). Extra arguments go to flashattn-bench (--help lists them).
# On a fresh machine it first installs what the C++ build needs (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
fa_setup_cxx
build=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${FLASHATTN_CMAKE_ARGS:-}
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target flashattn-bench
"$build/flashattn-bench" "$@"
