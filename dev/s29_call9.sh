#!/usr/bin/env bash
# Session script (s29 call 9, deleted after its run): split-key decode CTAs merge their warps'
# partial O by column slices (every warp merges and writes a quarter of the d tiles) instead of
# warp 0 alone (src/cuda/sm80/fwd_kernel.h). Packages (d128 bf16): new (this tree) and base (this
# tree with the previous fwd_kernel.h, dev/s29_base_fwd_kernel.h). CUDA tests of the decode /
# split / kvcache / sink / FP8-cache paths on new, then the decode suite on base and new.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
T0=$(date +%s)
rm -rf /tmp/base-src && mkdir /tmp/base-src && tar cf - --exclude='./build*' --exclude=./.git . | tar xf - -C /tmp/base-src
cp dev/s29_base_fwd_kernel.h /tmp/base-src/src/cuda/sm80/fwd_kernel.h
build() {  # name srcdir
  CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=/tmp/build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "$2" >"$OUT/r/pip-$1.log" 2>&1 || echo "BUILD FAILED $1"
}
build new . & build base /tmp/base-src & wait
echo "built in $(( $(date +%s) - T0 )) s"
PYTHONPATH=/tmp/ab-new timeout 170 python3 -m pytest tests/python/test_kvcache.py tests/python/test_cuda.py tests/python/test_sink.py \
  tests/python/test_fp8.py -q -p no:cacheprovider -k "cuda" >"$OUT/r/test-new.log" 2>&1
echo "tests: $(tail -1 "$OUT/r/test-new.log") at $(( $(date +%s) - T0 )) s"
grep -E "^FAILED|Error" "$OUT/r/test-new.log" | head -10
for n in base new; do
  PYTHONPATH=/tmp/ab-$n timeout 60 python3 bench/bench.py --suite decode --impls flashattn,kvcache,kvcache_paged16,sdpa_cudnn \
    --repeats 20 --out "$OUT/r/decode-$n.json" 2>&1 | grep "^decode" | tee "$OUT/r/decode-$n.log"
done
echo "benched at $(( $(date +%s) - T0 )) s"
tar czf "$OUT/s29c9.tgz" -C "$OUT" r && rm -rf "$OUT/r"
