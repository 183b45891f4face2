#!/usr/bin/env bash
# One device call: the d192 Hopper backward (split roles, new) checked and timed against sm80,
# sanitizers on the d192/d256 backward and the pinned d128 forward, ncu of the d128 backward.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
dims="64;128;192;256"
CMAKE_BUILD_PARALLEL_LEVEL=10 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/fa \
  -Cbuild-dir=/tmp/bfa -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$dims" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/pip.log" 2>&1 &
( cmake -S . -B /tmp/bg -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    "-DFLASHATTN_CUDA_HEAD_DIMS=$dims" -DFLASHATTN_CUDA_DTYPES=bf16 >"$OUT/cbuild.log" 2>&1 &&
  cmake --build /tmp/bg -j 6 --target flashattn_test_correctness flashattn_test_special >>"$OUT/cbuild.log" 2>&1 ) &
wait; echo "builds $(( $(date +%s) - start )) s; pip $([ -d /tmp/fa/flashattn ] && echo ok || echo FAILED); ctest bins $(ls /tmp/bg/tests/cpp/flashattn_test_{correctness,special} 2>/dev/null | wc -l)/2"
grep -h "spill" /tmp/bfa/build.log "$OUT/cbuild.log" 2>/dev/null | grep -v " 0 bytes spill" | sort | uniq -c | head -3
export PYTHONPATH=/tmp/fa
echo "test_cuda sm90: $(FLASHATTN_CUDA_PATH=sm90 timeout 200 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider 2>&1 | tail -1)"
c=/tmp/bg/tests/cpp/flashattn_test_correctness
echo "correctness d192/d256 cuda (sm90): $(FLASHATTN_CUDA_PATH=sm90 timeout 120 $c --gtest_filter='*cuda_*_d192_*:*cuda_*_d256_*:*cuda_e_dv_192*' 2>&1 | grep -E '^\[  (PASSED|FAILED) ' | head -3 | tr '\n' ' ')"
echo "== dv probe (192/128): default, then sm80"
timeout 100 python3 dev/dv_probe.py --repeats 10 --out "$OUT/dv-sm90.json" 2>&1 | tail -10 | cut -c1-220
FLASHATTN_CUDA_PATH=sm80 timeout 100 python3 dev/dv_probe.py --repeats 10 --out "$OUT/dv-sm80.json" 2>&1 | tail -10 | cut -c1-220
echo "== sanitizers (sm90): d192/d256 backward (small), pinned forward d128"
f='*cuda_*_q[0-9]_*_d192_*bwd*:*cuda_*_q[0-9][0-9]_*_d256_*bwd*:*cuda_e_dv_192*:*cuda_*_q[0-9][0-9]_*_d128_*fwd*'
echo "cases: $($c --gtest_list_tests --gtest_filter="$f" | grep -c '^  ')"
for tool in memcheck racecheck synccheck; do
  FLASHATTN_CUDA_PATH=sm90 timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $c --gtest_filter="$f" >"$OUT/san-$tool.log" 2>&1
  echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/san-$tool.log" | head -1)"
done
echo "== ncu backward d128 (ours vs cuDNN)  t=$(( $(date +%s) - start ))"
PEERS=sdpa_cudnn OUT=$OUT timeout 120 bash dev/ncu_attn.sh bwd "1 16 16384 128" 2>&1 | grep -E "Duration|Warp Cycles Per Issued|Executed Ipc A|^  [a-z_:]+.*\(" | head -30
PEERS=sdpa_cudnn OUT=$OUT timeout 90 bash dev/ncu_attn.sh bwd "4 16 4096 128 causal" 2>&1 | grep -E "Duration|^  [a-z_:]+.*\(" | head -20
gzip -f "$OUT"/ncu-*.txt
echo "total $(( $(date +%s) - start )) s"
