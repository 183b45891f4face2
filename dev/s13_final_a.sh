#!/usr/bin/env bash
# Thirteenth session (s13), final call A (one H200, < 540 s), run from .carry/snap with
# .carry/fa4a beside it (FlashAttention-4's first half, kept in /tmp/fa4w for call B):
#  1. the package (every head dim, bf16 and fp16) in /tmp/pk, kept for call B;
#  2. test_cuda.py and test_torch.py under FLASHATTN_CUDA_PATH=sm90, test_cuda.py under auto;
#  3. compute-sanitizer memcheck, racecheck and synccheck of the d64 short-rows kernels (masked:
#     fwd_d64_short_causal; unmasked: bwd_d64 at 1024 rows) under sm90;
#  4. the fp16 full suite, ours against SDPA cuDNN in one process.
# Writes $OUT/full-fp16.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 530 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/fa4w
[ -d ../fa4a ] && cp ../fa4a/* /tmp/fa4w/ && t "fa4a kept: $(ls /tmp/fa4w | wc -l) files"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 260 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;192;256" \
  "-Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16;fp16" . \
  > /tmp/logs/pip.log 2>&1
[ -d /tmp/pk/flashattn ] || { echo "build failed"; grep -E "error" /tmp/logs/pip.log | head; tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }
t built
export PYTHONPATH=/tmp/pk
runs=("sm90 tests/python/test_cuda.py" "sm90 tests/python/test_torch.py" "auto tests/python/test_cuda.py")
for i in "${!runs[@]}"; do
  read -r path f <<<"${runs[$i]}"
  ( if [ "$path" = auto ]; then unset FLASHATTN_CUDA_PATH; else export FLASHATTN_CUDA_PATH=$path; fi
    timeout "$(cap 200)" python3 -m pytest "$f" -q -p no:cacheprovider > /tmp/logs/py-$i.log 2>&1
    echo "$f ($path): $(tail -1 /tmp/logs/py-$i.log)" ) &
done
wait
grep -hE "^FAILED|^ERROR" /tmp/logs/py-*.log | head -8
t tested
for tool in memcheck racecheck synccheck; do
  FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 60)" compute-sanitizer --tool $tool --print-limit 20 python3 dev/san_cases.py \
    --only fwd_d64_short_causal,bwd_d64 > /tmp/logs/san-$tool.txt 2>&1
  t "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/logs/san-$tool.txt | tail -1) $(grep -c 'ok$' /tmp/logs/san-$tool.txt) ok, $(grep -c FAIL /tmp/logs/san-$tool.txt) FAIL"
done
timeout "$(cap 150)" python3 bench/bench.py --suite full --dtypes fp16 --impls flashattn,sdpa_cudnn --repeats 10 \
  --out $OUT/full-fp16.json > /tmp/logs/bench-fp16.log 2>&1
t "bench fp16 rc $?"
tar czf $OUT/logs.tgz -C /tmp/logs .
grep -E "^fp16" /tmp/logs/bench-fp16.log | cut -c1-150
