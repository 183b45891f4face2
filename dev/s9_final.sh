#!/usr/bin/env bash
# Ninth session, last GPU call: main with the sm90 block-sparse backward merged (d64/d128 bf16
# package with tests): ctest sparse|fp8|correctness|special under sm90, pytest
# (block-sparse, fp8, cuda), sanitizers on the sparse backward; the forward of today's defaults
# (butterfly epilogue, d64 chunks, FP8 d64 three consumers) against cuDNN; the sparse suite
# against FlexAttention (forward and backward); the d64 idle-tail A/B (FLASHATTN_DEV_SM90_FWD_IDLE_TAIL,
# against the fwd rows of the main package); the bias shared-memory A/B (bitwise check, probe).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
PIP="python3 -m pip install --no-build-isolation --no-deps -q"
(CMAKE_BUILD_PARALLEL_LEVEL=11 $PIP --target /tmp/pk -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
  "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > /tmp/pip.log 2>&1 \
  || { echo "main build failed"; grep -E "error" /tmp/pip.log | head; }) &
(CMAKE_BUILD_PARALLEL_LEVEL=5 $PIP --target /tmp/pbsm -Cbuild-dir=/tmp/bbsm -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
  -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_BIAS_SMEM . > /tmp/pipb.log 2>&1 \
  || { echo "bias-smem build failed"; grep -E "error" /tmp/pipb.log | head; }) &
(CMAKE_BUILD_PARALLEL_LEVEL=4 $PIP --target /tmp/pidle -Cbuild-dir=/tmp/bidle -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
  -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_SM90_FWD_IDLE_TAIL . > /tmp/pipi.log 2>&1 \
  || { echo "idle-tail build failed"; grep -E "error" /tmp/pipi.log | head; }) &
wait; t "packages built"
cmake --build /tmp/bb -j 16 > /tmp/gt.log 2>&1 || grep -E "error" /tmp/gt.log | head -5
t "gtests built"
export PYTHONPATH=/tmp/pk
(FLASHATTN_CUDA_PATH=sm90 ctest --test-dir /tmp/bb -j 6 --timeout 150 -L "sparse|fp8|correctness|special" > /tmp/ct-sm90.log 2>&1
 echo "ctest sm90 sparse|fp8|correctness|special: $(grep -E 'tests passed|tests failed' /tmp/ct-sm90.log)"
 grep -E "\(Failed\)|Timeout|SEGFAULT|Exception" /tmp/ct-sm90.log | head) &
(timeout 200 python3 -m pytest tests/python/test_block_sparse.py tests/python/test_fp8.py -q -p no:cacheprovider > /tmp/py1.log 2>&1
 echo "pytest block_sparse + fp8 (auto): $(tail -1 /tmp/py1.log)"
 FLASHATTN_CUDA_PATH=sm90 timeout 150 python3 -m pytest tests/python/test_block_sparse.py tests/python/test_cuda.py -q -p no:cacheprovider > /tmp/py2.log 2>&1
 echo "pytest block_sparse + cuda (sm90): $(tail -1 /tmp/py2.log)") &
(PYTHONPATH=/tmp/pidle FLASHATTN_CUDA_PATH=sm90 timeout 150 python3 -m pytest tests/python/test_cuda.py -q -x -p no:cacheprovider > /tmp/py3.log 2>&1
 echo "pytest cuda on the idle-tail variant (sm90, d64): $(tail -1 /tmp/py3.log)") &
wait; t "tests"
SP=$(find /tmp/bb -name flashattn_test_sparse -type f | head -1)
C='*SparseSm90Bwd.MatchesReference/sm90bwd_'
F="${C}varlen_lists_causal_ragged:${C}lists_96x80_mixed_mask_gqa"
mkdir -p /tmp/san
for tool in racecheck memcheck; do
  FLASHATTN_CUDA_PATH=sm90 timeout 75 compute-sanitizer --tool $tool --print-limit 20 $SP --gtest_filter="$F" > /tmp/san/$tool.txt 2>&1
  echo "$tool sparse bwd: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san/$tool.txt | tail -1) ok $(grep -c 'OK \]' /tmp/san/$tool.txt)"
done; t "sanitizers"
cp /tmp/ct-sm90.log /tmp/py1.log /tmp/py2.log /tmp/py3.log /tmp/san/
tar czf $OUT/logs.tgz -C /tmp/san .
timeout 150 python3 bench/bench.py --suite sparse --block-density 1,0.108 --impls flashattn,flex --repeats 10 \
  --out $OUT/sparse.json 2>&1 | grep -E "^bf16|wrote|Error|error" | head -8
t "sparse bench"
timeout 100 python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 --impls flashattn,flashattn_fp8,sdpa_cudnn \
  --no-backward --repeats 20 --out $OUT/fwd.json 2>&1 | grep -E "^bf16" | head -30
t "fwd bench"
PYTHONPATH=/tmp/pidle timeout 40 python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64 --seqlens 512,1024,2048,4096 \
  --impls flashattn,sdpa_cudnn --no-backward --repeats 20 --out $OUT/idle.json 2>&1 | grep -E "^bf16" | head
t "idle-tail bench"
timeout 60 python3 dev/bias_smem_check.py --no-fp16 --save /tmp/bbase.pt > /tmp/san/bias-check.txt 2>&1 && \
  PYTHONPATH=/tmp/pbsm timeout 60 python3 dev/bias_smem_check.py --no-fp16 --save /tmp/bsm.pt --compare /tmp/bbase.pt >> /tmp/san/bias-check.txt 2>&1
echo "bias bitwise check: rc $? $(tail -2 /tmp/san/bias-check.txt | tr '\n' ' ')"
for n in base bsm; do P=/tmp/pk; [ $n = bsm ] && P=/tmp/pbsm
  PYTHONPATH=$P timeout 50 python3 dev/bias_probe.py --seqlens 2048 --out $OUT/bias-probe-$n.json 2>&1 | tail -3; done
t "bias"
tar czf $OUT/logs.tgz -C /tmp/san .
