#!/usr/bin/env bash
# Tenth session, fourth GPU call (one H200, 16 cores, < 570 s): main with the two helper branches
# merged (sm90-fwd-bias: attn_bias / attn_mask on the Hopper forward, FwdBiasTraits; sm90-bwd-dv:
# the 192/128 Hopper backward, BwdDvTraits), the d64 dQ column split, the backward CTA order and
# d64's short-rows tile. One d64/d128/d192 bf16 package with tests:
#  1. tests (a failure is printed, the timings still run for what passed): pytest test_bias,
#     test_cuda, test_block_sparse under sm90 and auto; ctest bias|sparse|head_dim_v|layout|
#     correctness|special under sm90;
#  2. sanitizers: memcheck and racecheck on two BiasSm90 cases, synccheck on a BiasSm90 case and
#     on the two SparseSm90Bwd cases (synccheck had not run on the sparse backward);
#  3. timings against cuDNN in one process each: the bias probe (dev/bias90_probe.py), dsv3
#     (192/128) 2k/4k/8k fwd+bwd, full suite d64/d128 512..16k fwd+bwd.
# Writes $OUT/{probe,dsv3,full}.json, $OUT/logs.tgz; the summary on stdout.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 570 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 260 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;192" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > /tmp/logs/pip.log 2>&1
[ -d /tmp/pk/flashattn ] || { echo "package build failed"; grep -E "error" /tmp/logs/pip.log | head -20; exit 1; }
t "package built"
timeout "$(cap 120)" cmake --build /tmp/bb -j 16 > /tmp/logs/gt.log 2>&1 || grep -E "error" /tmp/logs/gt.log | head -5
t "gtests built"
export PYTHONPATH=/tmp/pk
(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 170)" ctest --test-dir /tmp/bb -j 5 --timeout 150 \
   -L "bias|sparse|head_dim_v|layout|correctness|special" > /tmp/logs/ct-sm90.log 2>&1
 echo "ctest sm90 bias|sparse|head_dim_v|layout|correctness|special: $(grep -E 'tests passed|tests failed' /tmp/logs/ct-sm90.log)"
 grep -E "\(Failed\)|Timeout|SEGFAULT|Exception" /tmp/logs/ct-sm90.log | head -8) &
(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 170)" python3 -m pytest tests/python/test_bias.py tests/python/test_cuda.py \
   tests/python/test_block_sparse.py -q -p no:cacheprovider > /tmp/logs/py-sm90.log 2>&1
 echo "pytest bias+cuda+block_sparse (sm90): $(tail -1 /tmp/logs/py-sm90.log)"; grep -E "^FAILED|^ERROR" /tmp/logs/py-sm90.log | head -10
 timeout "$(cap 120)" python3 -m pytest tests/python/test_bias.py tests/python/test_cuda.py -q -p no:cacheprovider \
   > /tmp/logs/py-auto.log 2>&1
 echo "pytest bias+cuda (auto): $(tail -1 /tmp/logs/py-auto.log)"; grep -E "^FAILED|^ERROR" /tmp/logs/py-auto.log | head -10) &
wait; t "tests"
BI=$(find /tmp/bb -name flashattn_test_bias -type f | head -1)
SP=$(find /tmp/bb -name flashattn_test_sparse -type f | head -1)
BF=$("$BI" --gtest_list_tests --gtest_filter='*BiasSm90*' 2>/dev/null | awk '/^[^ ]/{s=$1} /^  /{print s $1}' | head -2 | paste -sd:)
echo "bias sanitizer cases: $BF"
for tool in memcheck racecheck synccheck; do
  FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 60)" compute-sanitizer --tool $tool --print-limit 10 "$BI" --gtest_filter="$BF" \
    > /tmp/logs/san-bias-$tool.txt 2>&1
  echo "$tool bias fwd: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/logs/san-bias-$tool.txt | tail -1) ok $(grep -c 'OK \]' /tmp/logs/san-bias-$tool.txt)"
done
C='*SparseSm90Bwd.MatchesReference/sm90bwd_'
FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 80)" compute-sanitizer --tool synccheck --print-limit 10 "$SP" \
  --gtest_filter="${C}varlen_lists_causal_ragged:${C}lists_96x80_mixed_mask_gqa" > /tmp/logs/san-sparse-bwd-synccheck.txt 2>&1
echo "synccheck sparse bwd: rc $? $(grep -E 'ERROR SUMMARY' /tmp/logs/san-sparse-bwd-synccheck.txt | tail -1) ok $(grep -c 'OK \]' /tmp/logs/san-sparse-bwd-synccheck.txt)"
t "sanitizers"
tar czf $OUT/logs.tgz -C /tmp/logs .
timeout "$(cap 100)" python3 dev/bias90_probe.py --out "$OUT/probe.json" > /tmp/logs/probe.log 2>&1
t "bias probe"
timeout "$(cap 70)" python3 bench/bench.py --suite dsv3 --seqlens 2048,4096,8192 --impls flashattn,sdpa_cudnn --repeats 20 \
  --out $OUT/dsv3.json > /tmp/logs/dsv3.log 2>&1
t "dsv3"
timeout "$(cap 120)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 --impls flashattn,sdpa_cudnn \
  --repeats 20 --out $OUT/full.json > /tmp/logs/full.log 2>&1
t "full"
tar czf $OUT/logs.tgz -C /tmp/logs .
sed -n '/^forward TFLOP/,$p' /tmp/logs/probe.log | head -30
python3 dev/ab_table.py --figure bwd_tflops --peer sdpa_cudnn bench/results/h200-2026-12-02-dsv3-7a3a69e.json $OUT/dsv3.json
python3 dev/ab_table.py --figure fwd_tflops --peer sdpa_cudnn $OUT/full.json
python3 dev/ab_table.py --figure bwd_tflops --peer sdpa_cudnn $OUT/full.json
