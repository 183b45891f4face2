#!/usr/bin/env bash
# On the GPU machine (device tool): build with all cores, run the GPU tests (C++ and Python),
# benchmark against PyTorch SDPA (cuDNN and flash backends) in the same process, write logs and
# JSON under $OUT, and print a short table last.
#   SUITE=quick|full|decode|none   benchmark suite (default quick); several: SUITE="quick decode"
#   SANITIZE=1                     also run compute-sanitizer memcheck + racecheck on a reduced set
#   TESTS=0                        skip the test suites
#   LARGE=0                        skip ctest's `large` label (2^31-element and 100k-token tests, ~40 s)
# From this machine: `bash scripts/snapshot.sh` (HEAD into .carry/snap, with SOURCE_COMMIT), then the
# device tool with carry [".carry/snap"] and command "cd .carry/snap && OUT=$OUT bash scripts/gpu-check.sh".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
jobs=$(nproc)
status=0
log() { printf '\n== %s\n' "$*"; }

log "build (C++, $jobs jobs)"
start=$(date +%s)
# sm_90 only: the H200 runs sm_90 machine code; sm_80 code would only lengthen the build.
arch=${ARCH:-90}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES="$arch" \
  >"$OUT/build.log" 2>&1 && cmake --build build-gpu -j "$jobs" >>"$OUT/build.log" 2>&1 || {
  tail -40 "$OUT/build.log"; exit 1; }
echo "C++ build: $(( $(date +%s) - start )) s"
grep -h "spill" "$OUT/build.log" | sort | uniq -c | head -5 || true

log "python package"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=$jobs python3 -m pip install --no-build-isolation --no-deps -q \
  -Cbuild-dir=build-gpu/python -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES="$arch" . >"$OUT/pip.log" 2>&1 || { tail -40 "$OUT/pip.log"; exit 1; }
echo "pip install (full kernel set): $(( $(date +%s) - start )) s"

if [ "${TESTS:-1}" = 1 ]; then
  log "ctest"
  large=(); [ "${LARGE:-1}" = 0 ] && large=(-LE large)
  ctest --test-dir build-gpu -j 4 --output-on-failure "${large[@]}" >"$OUT/ctest.log" 2>&1 || status=1
  tail -15 "$OUT/ctest.log"
  log "pytest (one process per file, so a crash names its file)"
  : >"$OUT/pytest.log"
  for f in tests/python/test_*.py; do
    python3 -X faulthandler -m pytest "$f" -q -rs -p no:cacheprovider >>"$OUT/pytest.log" 2>&1 || status=1
    echo "$f: $(tail -1 "$OUT/pytest.log")"
  done
fi

if [ "${SANITIZE:-0}" = 1 ]; then
  log "compute-sanitizer"
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/cpp/flashattn_test_special \
      --gtest_filter='Backends/Special.SeqlenOne/cuda:Backends/Special.FullyMasked*/cuda:Backends/Special.Deterministic*/cuda:Backends/Special.SplitKv*/cuda:Backends/Special.Varlen*/cuda' \
      >"$OUT/sanitizer-$tool.log" 2>&1
    echo "$tool: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer-$tool.log") clean summaries)"
  done
fi

for suite in ${SUITE:-quick}; do
  [ "$suite" = none ] && continue
  log "bench $suite"
  python3 bench/bench.py --suite "$suite" --out "$OUT/bench-$suite.json" 2>&1 | tee "$OUT/bench-$suite.txt" || status=1
done
exit $status
