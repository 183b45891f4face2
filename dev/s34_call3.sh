#!/usr/bin/env bash
# s34 call 3 (GPU machine; the session's last ~560 s): the new default (two Q slots and the Q first
# on the d64 / d128 short-rows kernels, masked d128 <= 512 rows on them).
#   C++ build (64;128;256, bf16 and fp16, tests) -> ctest under sm90 and auto (fp16 and the C++
#   Special / Correctness sink and fully-masked cases: to-do 19 (0)), concurrently;
#   bf16 package 64;128;256 (def) -> test_cuda + test_sink under sm90, racecheck / synccheck of
#   the masked d128 short rows; then the forward record (d64-d256, 512-16k, two passes, cuDNN).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s34logs3; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pack() { tar -czf "$OUT/logs.tar.gz" -C $L . 2>/dev/null; }
( cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    "-DFLASHATTN_CUDA_HEAD_DIMS=64;128;256" >$L/build.log 2>&1 && cmake --build build-gpu -j 16 >>$L/build.log 2>&1
  echo "cmake rc=$? $(el)" ) &
( CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-def \
    -Cbuild-dir=build-ab-def -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >$L/pip-def.log 2>&1; echo "pip def rc=$? $(el)" ) &
wait
grep -h "spill\|C751" $L/build.log | sort | uniq -c | head -5
pack
for path in sm90 auto; do
  lab="^(large|install)\$"
  ( FLASHATTN_CUDA_PATH=$path timeout 170 ctest --test-dir build-gpu -j 4 --output-on-failure -LE "$lab" >$L/ctest-$path.log 2>&1
    echo "ctest $path rc=$? $(grep -E 'tests passed|tests failed' $L/ctest-$path.log) $(el)" ) &
done
( FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-def timeout 170 python3 -m pytest tests/python/test_cuda.py tests/python/test_sink.py \
    -q -p no:cacheprovider >$L/pytest-def.log 2>&1; echo "pytest def rc=$? $(tail -1 $L/pytest-def.log) $(el)" ) &
for tool in racecheck synccheck; do
  ( FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-def timeout 170 compute-sanitizer --tool $tool python3 dev/san_cases.py \
      --only fwd_d128_short_tiles_causal,fwd_d128_short_tiles,fwd_d64_short_tiles_causal >$L/san-$tool.log 2>&1
    echo "san $tool rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-$tool.log | tr '\n' ' ') $(el)" ) &
done
wait
grep -E "^\s*[0-9]+/[0-9]+ Test.*(Failed|Timeout|Exception)" $L/ctest-*.log | head -10
pack
for p in 1 2; do
  PYTHONPATH=/tmp/ab-def python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 --no-backward \
    --head-dims 64,128,256 --seqlens 512,1024,2048,16384 --repeats 30 --out "$L/rec-$p.json" >>$L/bench.txt 2>&1
  echo "bench rec-$p rc=$? $(el)"; pack
done
python3 dev/ab_table.py $L/rec-1.json $L/rec-2.json 2>&1 | tail -26
echo "done $(el)"
