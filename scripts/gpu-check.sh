#!/usr/bin/env bash
# On the GPU machine (device tool): build with all cores, run the GPU tests (C++ and Python),
# benchmark against PyTorch SDPA (cuDNN and flash backends) in the same process, write logs and
# JSON under $OUT, and print a short table last.
#   SUITE=quick|full|dsv3|decode|mla|none   benchmark suite (default quick); several: SUITE="quick decode"
#                                  (dsv3: DeepSeek-V3 prefill, head_dim 192 / head_dim_v 128, needs 192 built)
#   BENCH_ARGS="--impls a,b"       extra bench.py arguments
#   SANITIZE=1                     also run compute-sanitizer memcheck, racecheck, synccheck on a reduced set
#                                  (SANITIZE=kvcache: only the KV-cache memcheck and racecheck;
#                                  SANITIZE=sparse: only the bias/mask backward's)
#   TESTS=0                        skip the test suites (TESTS=ctest or TESTS=pytest: only that one)
#   BUILD=0                        reuse build-gpu and the installed package of an earlier call on
#                                  the same (still warm) machine
#   CTEST_ARGS="-R kvcache"        extra ctest arguments (e.g. a subset of the suite)
#   PYTEST_FILES="tests/python/test_kvcache.py"  the pytest files (default: all, then test_cuda.py and
#                                  test_torch.py again under each non-auto path)
#   PYTEST_JOBS=4                  pytest processes at a time (one per file and path; 1: one after another)
#   LARGE=0                        skip ctest's `large` label (2^31-element and 100k-token tests, ~40 s)
#   PATHS="auto sm90 sm80"         FLASHATTN_CUDA_PATH values the GPU tests run under (src/cuda/cuda_backend.cu):
#                                  auto = the default dispatch, sm90 = the Hopper kernels wherever they can
#                                  run, sm80 = the sm80 kernels only. ctest runs under the first two
#                                  (CTEST_PATHS overrides; concurrently), test_cuda.py and
#                                  test_torch.py under each.
#   HEAD_DIMS="64;128;256"         trim the build (FLASHATTN_CUDA_HEAD_DIMS); default: all
#   FA4_WHEELS=DIR                 install FlashAttention-4 from the wheel files in DIR (DEVELOPERS.md)
#                                  so the benchmark times it as the peer `fa4`
#   FA2_TESTS=DIR                  also run FlashAttention v2.8.3's tests/test_flash_attn.py from DIR
#                                  against the installed package (scripts/flash-attn-tests.sh, FA2_* there)
# From this machine: `bash scripts/snapshot.sh` (HEAD into .carry/snap, with SOURCE_COMMIT), then the
# device tool with carry [".carry/snap"] and command "cd .carry/snap && OUT=$OUT bash scripts/gpu-check.sh".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
jobs=$(nproc)
status=0
log() { printf '\n== %s\n' "$*"; }

if [ "${BUILD:-1}" = 1 ]; then
log "build (C++, $jobs jobs)"
start=$(date +%s)
# sm_90 only: the H200 runs sm_90 machine code; sm_80 code would only lengthen the build.
arch=${ARCH:-90}
dims=()
[ -n "${HEAD_DIMS:-}" ] && dims=(-DFLASHATTN_CUDA_HEAD_DIMS="$HEAD_DIMS")
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES="$arch" "${dims[@]}" \
  >"$OUT/build.log" 2>&1 && cmake --build build-gpu -j "$jobs" >>"$OUT/build.log" 2>&1 || {
  tail -40 "$OUT/build.log"; exit 1; }
echo "C++ build: $(( $(date +%s) - start )) s"
grep -h "spill" "$OUT/build.log" | sort | uniq -c | head -5 || true
# ptxas serialising warpgroup products or injecting waits for them (DEVELOPERS.md, "Read ptxas's
# report"; printed without -v).
grep -h "C751[457]" "$OUT/build.log" | sort | uniq -c | head -5 || true

log "python package"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=$jobs python3 -m pip install --no-build-isolation --no-deps -q \
  -Cbuild-dir=build-gpu/python -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES="$arch" \
  ${HEAD_DIMS:+-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS="$HEAD_DIMS"} . >"$OUT/pip.log" 2>&1 || { tail -40 "$OUT/pip.log"; exit 1; }
echo "pip install (full kernel set): $(( $(date +%s) - start )) s"
fi

tests=${TESTS:-1}
paths=(${PATHS:-auto sm90 sm80})
if [ "$tests" = 1 ] || [ "$tests" = ctest ]; then
  exclude=(); [ "${LARGE:-1}" = 0 ] && exclude=(large)
  ctest_paths=(${CTEST_PATHS:-${paths[@]:0:2}})
  log "ctest (FLASHATTN_CUDA_PATH=${ctest_paths[*]}, concurrently)"
  # The install test writes one scratch prefix in the build tree and uses no GPU: only the first
  # path runs it (two concurrent runs of it collide on that prefix).
  first=1
  for path in "${ctest_paths[@]}"; do
    labels=("${exclude[@]}"); [ "$first" = 1 ] || labels+=(install); first=0
    le=(); [ ${#labels[@]} = 0 ] || le=(-LE "^($(IFS='|'; echo "${labels[*]}"))\$")
    # shellcheck disable=SC2086
    FLASHATTN_CUDA_PATH=$path ctest --test-dir build-gpu -j 4 --output-on-failure "${le[@]}" ${CTEST_ARGS:-} >"$OUT/ctest-$path.log" 2>&1 &
  done
  for job in $(jobs -p); do wait "$job" || status=1; done
  for path in "${ctest_paths[@]}"; do echo "-- $path"; tail -4 "$OUT/ctest-$path.log"; done
fi
if [ "$tests" = 1 ] || [ "$tests" = pytest ]; then
  # One process per file (a crash names its file), PYTEST_JOBS (default 4) at a time on the one
  # GPU: the suites are small, and one after another they took ~4 min of a 10-min call.
  log "pytest (one process per file, ${PYTEST_JOBS:-4} at a time)"
  runs=()
  for f in ${PYTEST_FILES:-tests/python/test_*.py}; do runs+=("auto $f"); done
  for path in "${paths[@]}"; do
    [ "$path" = auto ] || [ -n "${PYTEST_FILES:-}" ] && continue
    for f in tests/python/test_cuda.py tests/python/test_torch.py; do runs+=("$path $f"); done
  done
  logs=$(mktemp -d)
  for i in "${!runs[@]}"; do
    read -r path f <<<"${runs[$i]}"
    while [ "$(jobs -pr | wc -l)" -ge "${PYTEST_JOBS:-4}" ]; do wait -n || true; done
    ( if [ "$path" = auto ]; then unset FLASHATTN_CUDA_PATH; else export FLASHATTN_CUDA_PATH=$path; fi
      python3 -X faulthandler -m pytest "$f" -q -rs -p no:cacheprovider >"$logs/$i.log" 2>&1
      echo $? >"$logs/$i.rc" ) &
  done
  wait
  : >"$OUT/pytest.log"
  for i in "${!runs[@]}"; do
    read -r path f <<<"${runs[$i]}"
    [ "$(cat "$logs/$i.rc" 2>/dev/null)" = 0 ] || status=1
    label=$f; [ "$path" = auto ] || label="$f (FLASHATTN_CUDA_PATH=$path)"
    { echo "== $label"; cat "$logs/$i.log"; } >>"$OUT/pytest.log"
    echo "$label: $(tail -1 "$logs/$i.log")"
  done
  rm -rf "$logs"
fi

if [ -n "${FA2_TESTS:-}" ]; then
  log "flash_attn v2.8.3 tests/test_flash_attn.py"
  OUT=$OUT bash scripts/flash-attn-tests.sh "$FA2_TESTS" || status=1
fi

if [ -n "${FA4_WHEELS:-}" ]; then
  log "FlashAttention-4 from $FA4_WHEELS"
  site=/tmp/fa4-site
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
    $(ls "$FA4_WHEELS"/*.whl | grep -v cutlass_dsl_libs_core) >"$OUT/fa4-install.log" 2>&1 || tail -5 "$OUT/fa4-install.log"
  # pip will not merge -libs-core into the folder the other cutlass wheels made: unpack it.
  python3 -c "import sys, zipfile, glob; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob(sys.argv[2] + '/*cutlass_dsl_libs_core*.whl')]" "$site" "$FA4_WHEELS"
  export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
  python3 -c "from flash_attn.cute import flash_attn_func; print('fa4 imports')" 2>&1 | tail -2
fi

if [ "${SANITIZE:-0}" != 0 ]; then
  log "compute-sanitizer"
  # FLASHATTN_CUDA_PATH=sm90: the Hopper kernels take these small shapes too (synccheck: their
  # mbarriers and named barriers).
  tools="memcheck racecheck synccheck"; [ "$SANITIZE" = kvcache ] || [ "$SANITIZE" = sparse ] && tools=""
  for tool in $tools; do
    FLASHATTN_CUDA_PATH=sm90 compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/cpp/flashattn_test_special \
      --gtest_filter='Backends/Special.SeqlenOne/cuda:Backends/Special.FullyMasked*/cuda:Backends/Special.Deterministic*/cuda:Backends/Special.SplitKv*/cuda:Backends/Special.Varlen*/cuda' \
      >"$OUT/sanitizer-$tool.log" 2>&1
    echo "$tool: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer-$tool.log") clean summaries)"
  done
  # The KV-cache path: append + rotary and paged reads (page sizes 1-256, left padding; racecheck
  # for the paged offsets double-buffered in shared memory), and paged K/V in varlen calls.
  kv_tools="memcheck racecheck"; [ "$SANITIZE" = sparse ] && kv_tools=""
  for tool in $kv_tools; do
    compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/cpp/flashattn_test_kvcache \
      --gtest_filter='Backends/KVCache.*/cuda:KVCacheCpuVsCuda.*' >"$OUT/sanitizer-kvcache-$tool.log" 2>&1
    echo "$tool kvcache: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer-kvcache-$tool.log") clean summaries)"
    # Paged K/V in varlen calls (the same cache kernels with each sequence's query rows from
    # cu_seqlens_q; pages shared between sequences, empty sequences, forced splits).
    compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/cpp/flashattn_test_paged_varlen \
      --gtest_filter='Backends/PagedVarlen.*/cuda' >"$OUT/sanitizer-paged-varlen-$tool.log" 2>&1
    echo "$tool paged varlen: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer-paged-varlen-$tool.log") clean summaries)"
    # The e4m3 cache kernels (cp.async of 1-byte tiles, widened in registers; paged offsets).
    compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/cpp/flashattn_test_fp8 \
      --gtest_filter='Cases/Fp8CudaCache.*' >"$OUT/sanitizer-fp8cache-$tool.log" 2>&1
    echo "$tool fp8 cache: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer-fp8cache-$tool.log") clean summaries)"
    # The MLA decode kernel (cuda/mla): 16- and 32-row blocks, the S partial exchange, the
    # latent and separate-V paths, splits (the small cases only); BothStagesSmall: both stages
    # of the latent kernel with 2+ tiles per CTA at 16 and 32 rows.
    compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/cpp/flashattn_test_mla \
      --gtest_filter='Backends/Mla.BothStagesSmall/cuda:Backends/Mla.GqaTwoKVHeads/cuda:Backends/Mla.AppendIntoLatentCache/cuda:Backends/Mla.SeparateVCache/cuda:Backends/Mla.LearnableSink/cuda:Backends/Mla.LeftPadding/cuda' \
      >"$OUT/sanitizer-mla-$tool.log" 2>&1
    echo "$tool mla: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer-mla-$tool.log") clean summaries)"
  done
  # The bias/mask backward (ScoreMods::kBiasMask): dbias summed over the query rows in sP's
  # padding columns (racecheck for those slots), both dQ modes.
  sparse_tools="memcheck racecheck"; [ "$SANITIZE" = kvcache ] && sparse_tools=""
  for tool in $sparse_tools; do
    compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/tests/cpp/flashattn_test_sparse \
      --gtest_filter='SparseCudaDifferential.RowSummedDbias*:All/SparseCuda.*/bias_f32_rows_broadcast_gqa_causal_lists' \
      >"$OUT/sanitizer-sparse-$tool.log" 2>&1
    echo "$tool sparse: exit $? ($(grep -cE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$OUT/sanitizer-sparse-$tool.log") clean summaries)"
  done
fi

for suite in ${SUITE:-quick}; do
  [ "$suite" = none ] && continue
  log "bench $suite"
  # shellcheck disable=SC2086
  python3 bench/bench.py --suite "$suite" --out "$OUT/bench-$suite.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench-$suite.txt" || status=1
done
exit $status
