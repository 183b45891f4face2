#!/usr/bin/env bash
# The FP8 forward's tile sweep on the GPU machine (dev/NOTES.md, "FP8 forward on Hopper"): one
# Python package per candidate tile (fwd8_layout.h FLASHATTN_DEV_FP8_*), built in parallel, each
# checked by the CUDA cases of tests/python/test_fp8.py, then timed by bench.py (flashattn_fp8,
# forward, 4k and 16k, full and causal). Writes $OUT/fp8-tile-NAME.json, $OUT/fp8-tile-NAME.test
# and $OUT/pip-fp8-tile-NAME.log.
#   STEPS="build test bench" (default all three; a package already built is kept)
#   ONLY="base d128_bn192"   (default every candidate); BASE_DIMS="128;256" trims the base package
# Candidates: NAME HEAD_DIMS FLAGS ("base" is the shipped tile at every head dim).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
STEPS=${STEPS:-build test bench}
T0=$(date +%s)
t() { echo "[$(($(date +%s) - T0)) s] $*"; }
F=-DFLASHATTN_DEV_FP8
CANDIDATES=(
  "base ${BASE_DIMS:-64;128;256} "
  "d128_bn192 128 ${F}_HDIM=128 ${F}_BN=192"
  "d128_bn192_r240 128 ${F}_HDIM=128 ${F}_BN=192 ${F}_REGS240"
  "d128_r240 128 ${F}_HDIM=128 ${F}_REGS240"
  "d128_s3 128 ${F}_HDIM=128 ${F}_STAGES=3"
  "d256_bn128_r240 256 ${F}_HDIM=256 ${F}_BN=128 ${F}_REGS240"  # hung on the H200 (2026-12-02): producer 32, fixed to 24
  "d256_s3 256 ${F}_HDIM=256 ${F}_STAGES=3"
  "d64_c2 64 ${F}_HDIM=64 ${F}_CONSUMERS=2"  # the tile before three consumers became d64's default
  "d64_s3 64 ${F}_HDIM=64 ${F}_STAGES=3"
  "d64_bn192 64 ${F}_HDIM=64 ${F}_BN=192"
  "d64_bn256 64 ${F}_HDIM=64 ${F}_BN=256"
)
selected() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

if [[ " $STEPS " == *" build "* ]]; then
  n=0
  for c in "${CANDIDATES[@]}"; do
    read -r name dims flags <<<"$c"
    selected "$name" || continue
    [ -d "build-fp8t-pkg-$name/flashattn" ] && continue
    n=$((n + 1))
    CMAKE_BUILD_PARALLEL_LEVEL=${JOBS_EACH:-2} python3 -m pip install --no-build-isolation --no-deps -q \
      --target "build-fp8t-pkg-$name" -Cbuild-dir="build-fp8t-$name" \
      -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$dims" \
      -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=$flags" . \
      >"$OUT/pip-fp8-tile-$name.log" 2>&1 &
  done
  wait
  t "built $n packages"
  for c in "${CANDIDATES[@]}"; do
    read -r name _ <<<"$c"
    selected "$name" && [ ! -d "build-fp8t-pkg-$name/flashattn" ] && { echo "$name: build failed"; grep -m3 error "$OUT/pip-fp8-tile-$name.log"; }
  done
fi

for c in "${CANDIDATES[@]}"; do
  read -r name dims _ <<<"$c"
  selected "$name" && [ -d "build-fp8t-pkg-$name/flashattn" ] || continue
  export PYTHONPATH=$PWD/build-fp8t-pkg-$name
  if [[ " $STEPS " == *" test "* ]]; then
    timeout 120 python3 -m pytest tests/python/test_fp8.py -q -p no:cacheprovider \
      -k "cuda_fp8_forward_matches or cuda_fp8_varlen_ragged_matches" >"$OUT/fp8-tile-$name.test" 2>&1
    t "$name test: $(tail -1 "$OUT/fp8-tile-$name.test")"
  fi
  if [[ " $STEPS " == *" bench "* ]]; then
    timeout 120 python3 bench/bench.py --suite full --dtypes bf16 --head-dims "${dims//;/,}" --seqlens 4096,16384 \
      --impls flashattn_fp8 --no-backward --repeats 20 --out "$OUT/fp8-tile-$name.json" 2>&1 | grep -E "^bf16 d"
    t "$name bench"
  fi
done
