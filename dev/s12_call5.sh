#!/usr/bin/env bash
# Eleventh session, GPU call 5 (one H200, 16 cores, < 390 s), run from .carry/snap (the new tree)
# with .carry/base (the tree before the change under test) and .carry/fa4a (the first half of
# the FlashAttention-4 wheels, kept in /tmp/fa4w for call 6) beside it:
#  1. packages: new (d64;128;192 bf16, gtests) and base (d64;128 bf16), side by side;
#  2. at the same time (no timing runs then): pytest cuda + bias + block_sparse under sm90 and
#     cuda under auto, ctest correctness|special|layout|head_dim_v|sparse|bias under sm90 (new);
#     compute-sanitizer racecheck and synccheck on every dev/san_cases.py case, memcheck on the
#     persistent / varlen / mask-tile ones (new);
#  3. timings, one process each: full suite bf16 d64/d128 512..16k, flashattn and SDPA-cuDNN, base
#     then new; dsv3 (192/128) 2k/4k/8k on new; dev/ab_table.py of the backward and forward.
# Writes $OUT/{base,new,dsv3}.json, $OUT/logs.tgz; the summary on stdout.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 380 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/fa4w
[ -d ../fa4a ] && cp ../fa4a/* /tmp/fa4w/
PIP="python3 -m pip install --no-build-isolation --no-deps -q -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16"
(CMAKE_BUILD_PARALLEL_LEVEL=10 timeout 200 $PIP --target /tmp/pk-new -Cbuild-dir=/tmp/bb-new \
   "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;192" -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > /tmp/logs/pip-new.log 2>&1
 timeout 60 cmake --build /tmp/bb-new -j 16 > /tmp/logs/gt.log 2>&1 || grep -E "error" /tmp/logs/gt.log | head -5) &
(cd ../base && CMAKE_BUILD_PARALLEL_LEVEL=6 timeout 200 $PIP --target /tmp/pk-base -Cbuild-dir=/tmp/bb-base \
   "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" . > /tmp/logs/pip-base.log 2>&1) &
wait; t "built"
for n in new base; do
  [ -d /tmp/pk-$n/flashattn ] || { echo "package $n failed"; grep -E "error" /tmp/logs/pip-$n.log | head -10; }
done
[ -d /tmp/pk-new/flashattn ] || { tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }

export PYTHONPATH=/tmp/pk-new
(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 150)" python3 -m pytest tests/python/test_cuda.py tests/python/test_bias.py \
   tests/python/test_block_sparse.py -q -p no:cacheprovider > /tmp/logs/py-sm90.log 2>&1
 echo "pytest cuda+bias+block_sparse (sm90): $(tail -1 /tmp/logs/py-sm90.log)"; grep -E "^FAILED|^ERROR" /tmp/logs/py-sm90.log | head -10
) &
(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 160)" ctest --test-dir /tmp/bb-new -j 4 --timeout 200 \
   -L "correctness|special|layout|head_dim_v|sparse|bias" > /tmp/logs/ct-sm90.log 2>&1
 echo "ctest sm90: $(grep -E 'tests passed|tests failed' /tmp/logs/ct-sm90.log)"
 grep -E "\(Failed\)|Timeout|SEGFAULT|Exception" /tmp/logs/ct-sm90.log | head -8) &
(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 150)" compute-sanitizer --tool racecheck --print-limit 20 \
   python3 dev/san_cases.py --only bwd_d128_causal,bwd_d128_2tiles,bwd_d64_causal_2tiles,bwd_varlen_causal,bwd_192_128_causal,fwd_d64_short_causal,fwd_mask_tile > /tmp/logs/san-racecheck.txt 2>&1
 echo "racecheck: rc $? $(grep -E 'RACECHECK SUMMARY' /tmp/logs/san-racecheck.txt | tail -1) | $(grep -cE ' ok$' /tmp/logs/san-racecheck.txt) ok, $(grep -E 'ALL OK|SOME FAILED' /tmp/logs/san-racecheck.txt)"
 grep -E "Race reported" /tmp/logs/san-racecheck.txt | sort | uniq -c | head -8) &
(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 110)" compute-sanitizer --tool synccheck --print-limit 20 \
   python3 dev/san_cases.py > /tmp/logs/san-synccheck.txt 2>&1
 echo "synccheck: rc $? $(grep -E 'ERROR SUMMARY' /tmp/logs/san-synccheck.txt | tail -1) | $(grep -E 'ALL OK|SOME FAILED' /tmp/logs/san-synccheck.txt)"
 FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 60)" compute-sanitizer --tool memcheck --print-limit 20 python3 dev/san_cases.py \
   --only bwd_d128_2tiles,bwd_d64_causal_2tiles,bwd_varlen_causal,fwd_mask_tile,fwd_mask_keypad > /tmp/logs/san-memcheck.txt 2>&1
 echo "memcheck: rc $? $(grep -E 'ERROR SUMMARY' /tmp/logs/san-memcheck.txt | tail -1) | $(grep -E 'ALL OK|SOME FAILED' /tmp/logs/san-memcheck.txt)") &
wait; t "tests and sanitizers"
grep -E "FAIL" /tmp/logs/san-*.txt | head -5
tar czf $OUT/logs.tgz -C /tmp/logs .

for n in base new; do
  [ -d /tmp/pk-$n/flashattn ] || continue
  PYTHONPATH=/tmp/pk-$n timeout "$(cap 60)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
    --seqlens 512,1024,2048,4096,16384 --impls flashattn,sdpa_cudnn --repeats 20 --out $OUT/$n.json > /tmp/logs/bench-$n.log 2>&1
  t "bench $n rc $?"
done
timeout "$(cap 45)" python3 bench/bench.py --suite dsv3 --seqlens 4096,8192 --impls flashattn,sdpa_cudnn --repeats 20 \
  --out $OUT/dsv3.json > /tmp/logs/dsv3.log 2>&1
t "dsv3 rc $?"
tar czf $OUT/logs.tgz -C /tmp/logs .
if [ -f $OUT/base.json ] && [ -f $OUT/new.json ]; then
  python3 dev/ab_table.py --figure bwd_tflops $OUT/base.json $OUT/new.json
  python3 dev/ab_table.py --figure fwd_tflops $OUT/base.json $OUT/new.json
fi
[ -f $OUT/new.json ] && python3 dev/ab_table.py --figure bwd_tflops --peer sdpa_cudnn $OUT/new.json
[ -f $OUT/dsv3.json ] && python3 dev/ab_table.py --figure bwd_tflops --peer sdpa_cudnn $OUT/dsv3.json
t done
