#!/usr/bin/env bash
# Session script (s29 call 8, deleted after its run): where batch 1 x 4k decode's time goes
# through flash_attn_func, flash_attn_with_kvcache (dense) and kvcache on 16-row shuffled pages
# (issue 17), with the store phase split (stamps 4 and 5): dev/decode_trace.py on a d128 package
# with -DFLASHATTN_DEV_DECODE_TRACE, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
if [ ! -d /tmp/ab-tr2/flashattn ]; then
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-tr2 \
  -Cbuild-dir=build-ab-tr2 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_DECODE_TRACE" . \
  >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
fi
export PYTHONPATH=/tmp/ab-tr2
cd dev
for rep in 1 2; do
timeout 200 python3 decode_trace.py --shapes 4096:0:func,4096:0:kvcache,4096:0:paged16 2>&1 | tee -a "$OUT/r/trace.log"
done
cd ..
tar czf "$OUT/s29c8.tgz" -C "$OUT" r && rm -rf "$OUT/r"
