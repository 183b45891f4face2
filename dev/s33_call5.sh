#!/usr/bin/env bash
# s33 call 5 (GPU machine; the session's last ~280 s): data for a split model that knows paged
# caches (issue 17, to-do 18 (b)): decode time against the split count at batch 1-8, 4k / 16k
# keys, paged (16-row pages) and dense, on a d128 bf16 package of the tree's default.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-d \
  -Cbuild-dir=build-ab-d -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/pip.log" 2>&1
echo "pip rc=$? $(el)"
S=1x4096,2x4096,4x4096,8x4096,1x16384,4x16384
PYTHONPATH=/tmp/ab-d timeout 75 python3 dev/decode_splits.py --shapes $S --splits 0,4,6,8,12,16 --page-size 16 \
  --repeats 20 --out "$OUT/splits-paged16.json" >"$OUT/paged16.txt" 2>&1; echo "paged16 rc=$? $(el)"
PYTHONPATH=/tmp/ab-d timeout 60 python3 dev/decode_splits.py --shapes $S --splits 0,4,6,8,12,16 \
  --repeats 20 --out "$OUT/splits-dense.json" >"$OUT/dense.txt" 2>&1; echo "dense rc=$? $(el)"
tail -8 "$OUT/paged16.txt" "$OUT/dense.txt"
