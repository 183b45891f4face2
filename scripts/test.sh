#!/usr/bin/env bash
# Builds everything and runs every test: the C++ suite (ctest) and the Python suite (pytest).
# GPU tests run when a CUDA GPU is present and are reported as skipped otherwise.
# On a fresh machine it first installs what is missing (scripts/setup.sh: cmake, g++,
# GoogleTest, nanobind, scikit-build-core, numpy, pytest); silent when all is there.
#   BUILD_DIR            build folder (default: build)
#   FLASHATTN_CMAKE_ARGS extra CMake arguments, e.g. -DFLASHATTN_CUDA_HEAD_DIMS=128
#   FLASHATTN_SETUP=0    never install anything
#   FLASHATTN_SETUP_TORCH=1  also install torch when no working one is there (CI does; the torch
#                            tests then run on CPU tensors)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
fa_setup_cxx
fa_setup_python
[ "${FLASHATTN_SETUP_TORCH:-0}" = 1 ] && fa_setup_torch
build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_WERROR=ON ${FLASHATTN_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"

# Python package: same options, its own build folder (--config-settings, not -C: pip < 23.1,
# e.g. Debian 12's, has only the long form).
py_defines=()
for arg in ${FLASHATTN_CMAKE_ARGS:-}; do
  case "$arg" in -D*) py_defines+=("--config-settings=cmake.define.${arg#-D}") ;; esac
done
CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$PYTHON" -m pip install --no-build-isolation --no-deps -q \
  --config-settings=build-dir="$build/python" "${py_defines[@]}" .
"$PYTHON" -m pytest tests/python -q -rs
