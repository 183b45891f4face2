#!/usr/bin/env bash
# Session script (s23 call 3, deleted after its run; carry .carry/fa4a, the first half of FA4's
# cutlass-dsl-libs-cu13 wheel): keeps the half in /tmp/fa4w for call 4 on the still-warm machine;
# installs the branch's package (d64;128, bf16 + fp16) and runs test_cuda / test_torch under sm90
# (the fp16 d64 backward at 128-row steps, not yet run).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
mkdir -p /tmp/fa4w && cp .carry/fa4a/cu13.part.aa /tmp/fa4w/ && echo "half a kept: $(stat -c %s /tmp/fa4w/cu13.part.aa) bytes"
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" . >"$OUT/r/pip.log" 2>&1 \
  || { tail -30 "$OUT/r/pip.log"; exit 1; }
echo "$(el) built"
FLASHATTN_CUDA_PATH=sm90 timeout 280 python3 -m pytest tests/python/test_cuda.py tests/python/test_torch.py -q -x \
  -p no:cacheprovider >"$OUT/r/pytest-sm90.log" 2>&1
echo "pytest sm90 rc=$?: $(tail -1 "$OUT/r/pytest-sm90.log")"
echo "total $(el)"
tar czf "$OUT/s23c3.tgz" -C "$OUT" r && rm -rf "$OUT/r"
