#!/usr/bin/env bash
# Session script (s18, deleted after its run): the FP8 d256 tile (128 keys, 240 / 24 registers)
# and the decode merge staged in shared memory, on one build (bf16, head dims 64;96;128;256, the
# pip package plus the gtest binaries from the same objects): C++ FP8 CUDA cases, the split-KV /
# fused-combine bitwise tests, the KV-cache suite, racecheck / synccheck / memcheck, the Python
# KV-cache, decode and FP8 tests, then the decode split timing and the FP8 d256 forward against
# bf16 and cuDNN.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;96;128;256" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
cmake --build build-gpu/python -j 16 --target flashattn_test_fp8 flashattn_test_special flashattn_test_kvcache \
  >"$OUT/gtest-build.log" 2>&1 || { tail -30 "$OUT/gtest-build.log"; exit 1; }
echo "$(el) built; spill lines: $(grep -c 'bytes spill stores' "$OUT/pip.log")"
b=build-gpu/python/tests/cpp
gt() { FLASHATTN_CUDA_PATH=$1 $b/$2 --gtest_filter="$3" >"$OUT/gt-$2.log" 2>&1; echo "$(el) $2 ($1): $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gt-$2.log" | tr '\n' ' ') $(grep -c SKIPPED "$OUT/gt-$2.log") skip lines"; grep -E '^\[  FAILED  \] [A-Z]' "$OUT/gt-$2.log" | head -5; }
gt sm90 flashattn_test_fp8 '*Fp8CudaForward*:*Fp8Cuda.*:*Fp8CudaCache*' &
gt auto flashattn_test_special '*FusedSplitCombine*/cuda:*SplitKv*/cuda:*SeqlenOne*/cuda' &
gt auto flashattn_test_kvcache '*' & wait
( export PYTHONPATH=; python3 -m pytest tests/python/test_kvcache.py -q -p no:cacheprovider >"$OUT/t-kvcache.log" 2>&1; echo "$(el) test_kvcache: $(tail -1 "$OUT/t-kvcache.log")" ) &
( python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider -k "decode or split or graph or kvcache or cache" >"$OUT/t-cuda.log" 2>&1; echo "$(el) test_cuda decode/split: $(tail -1 "$OUT/t-cuda.log")" ) &
( python3 -m pytest tests/python/test_fp8.py -q -p no:cacheprovider >"$OUT/t-fp8.log" 2>&1; echo "$(el) test_fp8: $(tail -1 "$OUT/t-fp8.log")" ) & wait
san() { FLASHATTN_CUDA_PATH=$1 timeout 120 compute-sanitizer --tool $2 --error-exitcode 9 $b/$3 --gtest_filter="$4" >/tmp/san.log 2>&1
        echo "$(el) $2 $3: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.log | tail -1) $(grep -E '^\[  (PASSED|FAILED)  \]' /tmp/san.log | tr '\n' ' ')"; }
san sm90 racecheck flashattn_test_fp8 '*Fp8CudaForward*d256_causal:*Fp8CudaForward*d256_window'
san sm90 synccheck flashattn_test_fp8 '*Fp8CudaForward*d256_causal'
san auto memcheck flashattn_test_special '*FusedSplitCombine*/cuda'
san auto racecheck flashattn_test_special '*FusedSplitCombine*/cuda'
python3 dev/decode_splits.py --shapes 1x4096,1x16384,8x65536 --splits 0,16,32 --repeats 30 --out "$OUT/decode-splits.json" 2>&1 | tail -4
python3 bench/bench.py --suite full --dtypes bf16 --head-dims 256 --seqlens 4096,16384 --impls flashattn,flashattn_fp8,sdpa_cudnn \
  --no-backward --repeats 10 --out "$OUT/fp8-d256.json" 2>&1 | grep -E "^bf16 " | tail -8
echo "total $(el)"
