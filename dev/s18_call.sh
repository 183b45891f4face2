#!/usr/bin/env bash
# Session script (s18, deleted after its runs): one call that (1) builds the default package at
# d64 / d128 (bf16 and fp16: the backward's LSE read moved) and, in parallel, the FP8 sweep's
# packages; (2) runs test_cuda under auto and sm90 and test_torch under sm90 on the default
# package; (3) the FP8 sweep's tests and timing; (4) the decode trace (dev/decode_trace.py, its own
# d128 package); (5) memcheck / racecheck of the sanitizer cases.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=${HEAD_DIMS:-64;128}" . \
  >"$OUT/pip.log" 2>&1 &
pip_pid=$!
CMAKE_BUILD_PARALLEL_LEVEL=4 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/trace-pkg -Cbuild-dir=build-trace \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
  -Ccmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_DECODE_TRACE . >"$OUT/pip-trace.log" 2>&1 &
trace_pid=$!
OUT=$OUT STEPS=build ONLY="${FP8_ONLY:-base d256_bn128_r240 d128_bn192_r240}" BASE_DIMS="128;256" JOBS_EACH=3 \
  bash dev/fp8_tile_sweep.sh
wait $pip_pid || { tail -30 "$OUT/pip.log"; exit 1; }
echo "builds $(( $(date +%s) - start )) s"
run() { ( [ "$1" = auto ] || export FLASHATTN_CUDA_PATH=$1; python3 -m pytest "$2" -q -rs -p no:cacheprovider >"$OUT/t-$1-$(basename "$2" .py).log" 2>&1
          echo "$1 $2: $(tail -1 "$OUT/t-$1-$(basename "$2" .py).log")" ); }
run auto tests/python/test_cuda.py & run sm90 tests/python/test_cuda.py & run sm90 tests/python/test_torch.py &
run sm90 tests/python/test_bias.py & wait
echo "tests $(( $(date +%s) - start )) s"
OUT=$OUT STEPS="test bench" ONLY="${FP8_ONLY:-base d256_bn128_r240 d128_bn192_r240}" bash dev/fp8_tile_sweep.sh
( cd "$OUT" && tar czf fp8-sweep.tgz fp8-tile-* pip-fp8-tile-*.log 2>/dev/null; rm -f fp8-tile-* pip-fp8-tile-*.log )
wait $trace_pid && PYTHONPATH=/tmp/trace-pkg python3 dev/decode_trace.py --shapes 4096:0,4096:16,4096:32,16384:0 || tail -5 "$OUT/pip-trace.log"
rm -f "$OUT/pip-trace.log"
san() { FLASHATTN_CUDA_PATH=sm90 timeout 150 compute-sanitizer --tool $1 --error-exitcode 9 python3 dev/san_cases.py --only "$2" >"$OUT/san-$1.log" 2>&1
        echo "$1 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$1.log" | tail -1) $(grep -cE ' ok$' "$OUT/san-$1.log") ok, $(grep -c FAIL "$OUT/san-$1.log") FAIL [$(( $(date +%s) - start )) s]"; }
san memcheck bwd_d64_causal,bwd_d128,fwd_bias_mask_bits_d64,fwd_bias_mask_bits_d128 &
san racecheck bwd_d64,fwd_bias_mask_bits_d64 & wait
echo "total $(( $(date +%s) - start )) s"
