#!/usr/bin/env bash
# Session script (s23 call 5, deleted after its run): main with the d64 backward at 128-row
# steps. flashattn_test_correctness's CUDA d64 backward cases under sm90 (4 shards), then ncu of
# the d128 backward (ours and cuDNN, 4 x 16 x 4k, unmasked): tensor pipe against the
# shared-memory pipe (the evidence for what holds d128 at 0.90-0.97x FA4).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >"$OUT/r/pip.log" 2>&1 \
  || { tail -30 "$OUT/r/pip.log"; exit 1; }
echo "$(el) built"
cmake --build build-gpu/python -j 16 --target flashattn_test_correctness >"$OUT/r/gtest-build.log" 2>&1 || tail -20 "$OUT/r/gtest-build.log"
echo "$(el) gtest built"
T=build-gpu/python/tests/cpp/flashattn_test_correctness
for i in 0 1 2 3; do
  FLASHATTN_CUDA_PATH=sm90 GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 60 $T --gtest_filter='*cuda_*_d64_*bwd*' \
    >"$OUT/r/gtest-$i.log" 2>&1 &
done
wait
for i in 0 1 2 3; do echo "shard $i: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/r/gtest-$i.log" | tr '\n' ' ')"; done
grep -h "^\[  FAILED  \] [A-Z]" "$OUT"/r/gtest-*.log | head -5
echo "$(el) gtest"
PEERS=sdpa_cudnn timeout 100 ncu --clock-control none --profile-from-start off --cache-control all \
  --kernel-name regex:"bwd_kv|cudnn" --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
  --print-details all python3 dev/profile_attn.py bwd 4 16 4096 128 >"$OUT/r/ncu-bwd-d128-4k.txt" 2>&1
echo "$(el) ncu rc=$?"
grep -E "^  [a-zA-Z_:]+.*\(|Duration|Pipe|Shared|Tensor|Issue Slots|Stall MIO|mio|Bank" "$OUT/r/ncu-bwd-d128-4k.txt" | head -60
echo "total $(el)"
gzip "$OUT/r/ncu-bwd-d128-4k.txt"
tar czf "$OUT/s23c5.tgz" -C "$OUT" r && rm -rf "$OUT/r"
