#!/usr/bin/env bash
# Session script (s21 call 6, deleted after its run): branch fwd-mask-bits (every attn_mask packed
# into bits on the Hopper forward; the uint8 mask tile removed): the sm90 forward's bias/mask tests,
# the probe of mask / key-padding rows, then the BiasSm90 gtests under sm90.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >/tmp/pip.log 2>&1 || { tail -30 /tmp/pip.log; exit 1; }
echo "$(el) built"
(cmake --build build-gpu/python -j 16 --target flashattn_test_bias >/tmp/gt.log 2>&1 || tail -5 /tmp/gt.log) &
gtb=$!
FLASHATTN_CUDA_PATH=sm90 python3 -m pytest tests/python/test_bias.py -q -x -p no:cacheprovider -k "sm90 and (forward or dispatch or graph)" 2>&1 | tail -2
echo "$(el) pytest"
(cd dev && python3 bias90_probe.py --no-sm80 --head-dims 64,128 --shapes 8x2048 --kinds mask,maskkp --out $OUT/probe.json 2>&1 | grep -v -i warn | tail -5)
echo "$(el) probe"
wait $gtb
FLASHATTN_CUDA_PATH=sm90 build-gpu/python/tests/cpp/flashattn_test_bias --gtest_filter='All/BiasSm90.*' 2>&1 | tail -3
echo "total $(el)"
