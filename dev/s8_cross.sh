#!/usr/bin/env bash
# Eighth session: the cross-tile pipeline of the Hopper forward (FLASHATTN_DEV_SM90_CROSS_ALL=2:
# d64, masked d128 at 128 x 128, unmasked d128 at 128 x 160, each with two Q buffers) against
# main, forward only, one process each with cuDNN; the variant's correctness first. Second form:
# each tile's first block peeled, so the key-block loop has no branch.
# Run from a snapshot of the branch (cwd) with main's snapshot in ../base.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
pk() {  # name, tree, cuda flags, tests, jobs
  (cd "$2" && CMAKE_BUILD_PARALLEL_LEVEL=$5 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk-$1 \
    -Cbuild-dir=/tmp/bb-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=$3" -Ccmake.define.FLASHATTN_BUILD_TESTS=$4 . \
    > /tmp/pip-$1.log 2>&1) || { echo "BUILD $1 FAILED"; grep -E "error" /tmp/pip-$1.log | head -5; }
}
pk x "$PWD" "-DFLASHATTN_DEV_SM90_CROSS_ALL=2" ON 10 &
pk base "$PWD/../base" "" OFF 6 &
wait; t "packages built"
cmake --build /tmp/bb-x -j 16 > /tmp/gt.log 2>&1 || grep -E "error" /tmp/gt.log | head -5
t "gtests built"
FLASHATTN_CUDA_PATH=sm90 ctest --test-dir /tmp/bb-x -j 6 --timeout 100 -L "correctness|special" > /tmp/ct.log 2>&1
echo "ctest x (sm90): $(grep -E 'tests passed|tests failed' /tmp/ct.log)"; grep -E "\(Failed\)|Timeout|SEGFAULT" /tmp/ct.log
t "ctest"
SP=$(find /tmp/bb-x -name flashattn_test_special -type f | head -1)
for tool in racecheck synccheck; do
  FLASHATTN_CUDA_PATH=sm90 timeout 100 compute-sanitizer --tool $tool $SP \
    --gtest_filter='Backends/Special.SeqlenOne/cuda:Backends/Special.FullyMasked*/cuda:Backends/Special.Varlen*/cuda' > /tmp/san-$tool.txt 2>&1
  echo "$tool: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san-$tool.txt | tail -1)"
done; t "sanitizers"
for n in base x; do
  PYTHONPATH=/tmp/pk-$n python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,2048,4096,16384 \
    --impls flashattn,sdpa_cudnn --no-backward --repeats 20 --out $OUT/cross-$n.json 2>&1 | grep -E "^bf16|wrote" > /tmp/bench-$n.txt
done
paste -d'\n' /tmp/bench-base.txt /tmp/bench-x.txt | cut -c1-120
t "bench"
PYTHONPATH=/tmp/pk-x FLASHATTN_CUDA_PATH=sm90 timeout 120 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider -x 2>&1 | tail -2
t "pytest"
