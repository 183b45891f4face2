#!/usr/bin/env bash
# Fifteenth session (s15), GPU call A (one H200, < 540 s), run from .carry/snap with .carry/fa4a
# beside it (the first half of FlashAttention-4's -libs-cu13 wheel, kept in /tmp/fa4w for call B):
#  1. the O_TMA A/B (dev/NOTES.md next list item 3): base, otma (O through shared memory and a
#     bulk tensor store), otma1k (the same, d128 unmasked 1k on the short kernel), d64/d128 bf16,
#     forward against cuDNN, each package in its own process; test_cuda under sm90 on the variants;
#  2. compute-sanitizer memcheck, racecheck, synccheck of the O_TMA kernels on otma1k (d64 short
#     masked and unmasked, d128 window and short unmasked).
# Writes $OUT/ab-{base,otma,otma1k}.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 530 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/fa4w
[ -d ../fa4a ] && cp ../fa4a/* /tmp/fa4w/ && t "fa4a kept: $(ls /tmp/fa4w | wc -l) files"
declare -A flags=([base]="" [otma]="-DFLASHATTN_DEV_SM90_O_TMA" [otma1k]="-DFLASHATTN_DEV_SM90_O_TMA -DFLASHATTN_DEV_SM90_SHORT128_MAX=1024")
for v in base otma otma1k; do
  CMAKE_BUILD_PARALLEL_LEVEL=6 timeout 300 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$v \
    -Cbuild-dir=/tmp/b-$v -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${flags[$v]}" . > /tmp/logs/pip-$v.log 2>&1 &
done
wait
for v in base otma otma1k; do [ -d /tmp/ab-$v/flashattn ] || { echo "build $v failed"; grep -E "error" /tmp/logs/pip-$v.log | head; tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }; done
t built
for v in otma otma1k; do
  ( FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-$v timeout "$(cap 150)" python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider -x \
      > /tmp/logs/test-$v.log 2>&1; echo "test_cuda sm90 $v: $(tail -1 /tmp/logs/test-$v.log)" ) &
done
wait
grep -hE "^FAILED|^ERROR" /tmp/logs/test-*.log | head -5
t tested
# base runs first and last; its first pass is written to /tmp/logs/ab-base1.json (in logs.tgz).
# (The run of 2026-12-03 copied the first pass after the second had overwritten it: fixed here.)
for pass in base1:base otma:otma otma1k:otma1k base:base; do
  name=${pass%%:*} v=${pass#*:}
  dest=$OUT/ab-$name.json; [ "$name" = base1 ] && dest=/tmp/logs/ab-base1.json
  PYTHONPATH=/tmp/ab-$v timeout "$(cap 70)" python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 \
    --head-dims 64,128 --seqlens 512,1024,2048,4096,16384 --repeats 20 --no-backward --out "$dest" > /tmp/logs/bench-$name.log 2>&1
  t "bench $name rc $?"
done
for tool in memcheck racecheck synccheck; do
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-otma1k timeout "$(cap 70)" compute-sanitizer --tool $tool --print-limit 20 python3 dev/san_cases.py \
    --only fwd_d64_short_causal,bwd_d64,bwd_d128,bwd_d128_causal > /tmp/logs/san-$tool.txt 2>&1
  t "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/logs/san-$tool.txt | tail -1) $(grep -c 'ok$' /tmp/logs/san-$tool.txt) ok, $(grep -c FAIL /tmp/logs/san-$tool.txt) FAIL"
done
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
def load(p):
    if not os.path.exists(p): return {}
    return {(r['d'], r['n'], r['causal']): (r['flashattn'].get('fwd_tflops'), r['sdpa_cudnn'].get('fwd_tflops'))
            for r in json.load(open(p))['rows'] if 'flashattn' in r}
runs = {v: load(f"{out}/ab-{v}.json") for v in ('otma', 'otma1k', 'base')}
runs['base1'] = load('/tmp/logs/ab-base1.json')
print("d n causal | ours/cuDNN base1 base otma otma1k | otma/base otma1k/base")
for k in sorted(runs['base']):
    r = {v: runs[v].get(k, (None, None)) for v in runs}
    rat = {v: (r[v][0] / r[v][1]) if r[v][0] and r[v][1] else float('nan') for v in r}
    b = ((r['base'][0] or 0) + (r['base1'][0] or 0)) / 2 or float('nan')
    print(*k, '|', ' '.join(f"{rat[v]:.3f}" for v in ('base1', 'base', 'otma', 'otma1k')), '|',
          ' '.join(f"{(r[v][0] or 0) / b:.3f}" for v in ('otma', 'otma1k')))
PY
t done
