#!/usr/bin/env bash
# The MLA decode's GPU check (branch mla-decode), one device call of ~6-8 minutes on an H200:
# a trimmed build (head dims 128 and 576, bf16, sm_90), the host layout checks, the MLA gtest
# binary run directly, memcheck and racecheck over its small cases, test_mla.py on the
# installed package, and bench.py --suite mla. Logs under $OUT; a short summary on stdout.
# From this machine: `bash scripts/snapshot.sh`, then the device tool with carry [".carry/snap"]
# and command "cd .carry/snap && OUT=$OUT bash scripts/mla-gpu-check.sh".
#   BENCH=0   skip the benchmark      SANITIZE=0   skip the sanitizers
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
jobs=$(nproc)
dims="128;576"
start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
  -DFLASHATTN_CUDA_HEAD_DIMS="$dims" -DFLASHATTN_CUDA_DTYPES=bf16 >"$OUT/cbuild.log" 2>&1 &&
  cmake --build build-gpu -j "$jobs" --target flashattn_test_mla flashattn_test_layout >>"$OUT/cbuild.log" 2>&1
echo "cbuild rc=$? $(( $(date +%s) - start )) s; MLA kernels with spills: $(grep -c 'spilled to local memory in function .*3mla' "$OUT/cbuild.log")"

build-gpu/tests/cpp/flashattn_test_layout --gtest_filter='SmemLayout.Mla*' >"$OUT/layout.log" 2>&1
echo "layout rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/layout.log" | head -1)"

timeout 300 build-gpu/tests/cpp/flashattn_test_mla >"$OUT/gtest-mla.log" 2>&1
echo "gtest mla rc=$?:"
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/gtest-mla.log" | head -30

if [ "${SANITIZE:-1}" = 1 ]; then
  filter='Backends/Mla.BothStagesSmall/cuda:Backends/Mla.GqaTwoKVHeads/cuda:Backends/Mla.SeparateVCache/cuda'
  filter+=':Backends/Mla.LearnableSink/cuda:Backends/Mla.AppendIntoLatentCache/cuda'
  for tool in memcheck racecheck; do
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/cpp/flashattn_test_mla \
      --gtest_filter="$filter" >"$OUT/$tool-mla.log" 2>&1
    echo "$tool mla rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$tool-mla.log" | head -1)"
  done
fi

start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=$jobs python3 -m pip install --no-build-isolation --no-deps -q \
  -Cbuild-dir=build-gpu/python -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
  -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS="$dims" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/pip.log" 2>&1
echo "pip rc=$? $(( $(date +%s) - start )) s"
timeout 300 python3 -X faulthandler -m pytest tests/python/test_mla.py -q -rs -p no:cacheprovider \
  >"$OUT/py-test_mla.log" 2>&1
echo "test_mla.py rc=$?: $(tail -1 "$OUT/py-test_mla.log")"

if [ "${BENCH:-1}" = 1 ]; then
  timeout 400 python3 bench/bench.py --suite mla --repeats 10 --out "$OUT/bench-mla.json" >"$OUT/bench-mla.txt" 2>&1
  echo "bench rc=$?"
  cut -c1-330 "$OUT/bench-mla.txt" | grep '^mla' | head -30
fi
