#!/usr/bin/env bash
# Session script (s19 call 4, deleted after its run): ncu's source page of the sm90 bias backward
# (d128 bf16, 2 x 16 x 2k, a full bias that requires grad).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
echo "built $(( $(date +%s) - start )) s"
BIAS=full PEERS=sdpa_efficient OUT=$OUT timeout 170 bash dev/ncu_source.sh bwd "2 16 2048 128" 2>&1 | tail -16
rm -f "$OUT/pip.log"
echo "total $(( $(date +%s) - start )) s"
