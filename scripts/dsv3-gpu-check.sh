#!/usr/bin/env bash
# Issue 19's native 192/128 Hopper forward (DeepSeek-V3 prefill) on a GPU, one device call of
# ~8-10 minutes on an H200: one trimmed build (head dims 128 and 192, bf16 and fp16, sm_90) of the
# pip package with the two gtest binaries built from the same objects; the host tile checks;
# flashattn_test_head_dim_v and test_cuda.py's head_dim_v tests under FLASHATTN_CUDA_PATH=auto,
# sm90 and sm80 (concurrently); bench.py --suite dsv3 against SDPA cuDNN and flash. Logs and the
# bench JSON under $OUT; a short summary on stdout.
# From this machine: `bash scripts/snapshot.sh`, then the device tool with carry [".carry/snap"]
# and command "cd .carry/snap && OUT=$OUT bash scripts/dsv3-gpu-check.sh".
#   BUILD=0   reuse build-gpu of an earlier call on the same (still warm) machine
#   TESTS=0   skip the tests          BENCH=0   skip the benchmark
#   AB=1      then build the unpinned 192/128 kernel (-DFLASHATTN_DEV_SM90_FWD_PIN_NONE) into
#             /tmp/dsv3-nopin and time both forwards against cuDNN (dev/ab.sh's method; ~4 more
#             minutes: best as a second call with BUILD=0 TESTS=0 BENCH=0 AB=1)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
jobs=$(nproc)
dims="128;192"
defines=(-Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS="$dims"
         -Ccmake.define.FLASHATTN_CUDA_DTYPES="bf16;fp16")

if [ "${BUILD:-1}" = 1 ]; then
  start=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs python3 -m pip install --no-build-isolation --no-deps -q \
    -Cbuild-dir=build-gpu/python "${defines[@]}" -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >"$OUT/pip.log" 2>&1
  echo "pip rc=$? $(( $(date +%s) - start )) s"
  cmake --build build-gpu/python -j "$jobs" --target flashattn_test_head_dim_v flashattn_test_layout \
    >"$OUT/gtest-build.log" 2>&1
  echo "gtest build rc=$? $(( $(date +%s) - start )) s"
  # Resource use of the 192/128 kernels as built here (expected: REG 168; STACK 0, or 16 for the
  # window kernels, whose 24 B of spills are the producer's per-tile counters).
  for o in build-gpu/python/CMakeFiles/flashattn_sm90.dir/src/cuda/instantiations/sm90fwd*_dv128.cu.o; do
    echo "$(basename "$o" .cu.o): $(cuobjdump -res-usage "$o" 2>&1 | grep -o 'REG:[0-9]* STACK:[0-9]*' | head -1)"
  done
fi
bin=build-gpu/python/tests/cpp

if [ "${TESTS:-1}" = 1 ]; then
  $bin/flashattn_test_layout --gtest_filter='Sm90*' >"$OUT/layout.log" 2>&1
  echo "layout rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/layout.log" | head -1)"
  for path in auto sm90 sm80; do
    ( if [ "$path" = auto ]; then unset FLASHATTN_CUDA_PATH; else export FLASHATTN_CUDA_PATH=$path; fi
      timeout 400 $bin/flashattn_test_head_dim_v >"$OUT/gtest-head_dim_v-$path.log" 2>&1
      echo $? >"$OUT/gtest-head_dim_v-$path.rc"
      timeout 400 python3 -X faulthandler -m pytest tests/python/test_cuda.py -k head_dim_v -q -rs \
        -p no:cacheprovider >"$OUT/pytest-head_dim_v-$path.log" 2>&1
      echo $? >"$OUT/pytest-head_dim_v-$path.rc" ) &
  done
  wait
  for path in auto sm90 sm80; do
    echo "FLASHATTN_CUDA_PATH=$path: gtest rc=$(cat "$OUT/gtest-head_dim_v-$path.rc")" \
      "$(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gtest-head_dim_v-$path.log" | head -1);" \
      "pytest rc=$(cat "$OUT/pytest-head_dim_v-$path.rc") $(tail -1 "$OUT/pytest-head_dim_v-$path.log")"
    grep -E '^\[  FAILED ' "$OUT/gtest-head_dim_v-$path.log" | head -5
  done
fi

if [ "${BENCH:-1}" = 1 ]; then
  timeout 300 python3 bench/bench.py --suite dsv3 --impls flashattn,sdpa_cudnn,sdpa_flash --repeats 20 \
    --out "$OUT/bench-dsv3.json" >"$OUT/bench-dsv3.txt" 2>&1
  echo "bench rc=$?"
  grep -E '^(bf16|fp16) |error' "$OUT/bench-dsv3.txt" | cut -c1-300
fi

if [ "${AB:-0}" = 1 ]; then
  start=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/dsv3-nopin \
    -Cbuild-dir=build-gpu/nopin -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=192 \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_SM90_FWD_PIN_NONE" . \
    >"$OUT/pip-nopin.log" 2>&1
  echo "nopin pip rc=$? $(( $(date +%s) - start )) s"
  for variant in pin nopin; do
    pp=""; [ "$variant" = nopin ] && pp=/tmp/dsv3-nopin
    PYTHONPATH=$pp timeout 200 python3 bench/bench.py --suite dsv3 --impls flashattn,sdpa_cudnn --no-backward \
      --seqlens 2048,8192,16384 --repeats 20 --out "$OUT/ab-dsv3-$variant.json" >"$OUT/ab-dsv3-$variant.txt" 2>&1
    echo "== $variant (rc $?)"
    grep -E '^(bf16|fp16) ' "$OUT/ab-dsv3-$variant.txt" | cut -c1-200
  done
fi
