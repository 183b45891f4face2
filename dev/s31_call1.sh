#!/usr/bin/env bash
# s31 call 1 (session script, deleted at the session's end): the decode kernel's V copy after
# P V (new) against the copy at the top of the next block (base, -DFLASHATTN_DEV_DECODE_V_AT_TOP),
# d128 bf16 sm_90 packages; decode tests on new (also the first GPU run of s30's host-side
# review commits); decode suite alternated base/new with cuDNN.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
pkg() {  # name flags jobs
  CMAKE_BUILD_PARALLEL_LEVEL=$3 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=$2" . >/tmp/pip-$1.log 2>&1
}
start=$(date +%s)
pkg new "" 6 & pkg base "-DFLASHATTN_DEV_DECODE_V_AT_TOP" 5 &
( cmake -S . -B build-c -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    -DFLASHATTN_CUDA_HEAD_DIMS=128 -DFLASHATTN_CUDA_DTYPES=bf16 >/tmp/cmake.log 2>&1 &&
  cmake --build build-c -j 5 --target flashattn_test_special flashattn_test_kvcache flashattn_test_fp8 >>/tmp/cmake.log 2>&1 ) &
wait; echo "builds: $(( $(date +%s) - start )) s"
for n in new base; do [ -d /tmp/ab-$n/flashattn ] || { tail -30 /tmp/pip-$n.log; exit 1; }; done
{
  echo "== pytest (new)"
  PYTHONPATH=/tmp/ab-new python3 -m pytest -q -p no:cacheprovider tests/python/test_kvcache.py tests/python/test_sink.py 2>&1 | tail -3
  PYTHONPATH=/tmp/ab-new python3 -m pytest -q -p no:cacheprovider tests/python/test_cuda.py -k "decode or split or graph or kvcache" 2>&1 | tail -3
  PYTHONPATH=/tmp/ab-new python3 -m pytest -q -p no:cacheprovider tests/python/test_fp8.py -k cache 2>&1 | tail -3
  PYTHONPATH=/tmp/ab-new python3 -m pytest -q -p no:cacheprovider tests/python/test_host_path.py 2>&1 | tail -3
  echo "== gtest (new tree)"
  if [ -x build-c/tests/cpp/flashattn_test_special ]; then
    for t in special kvcache fp8; do
      echo "-- $t: $(build-c/tests/cpp/flashattn_test_$t --gtest_brief=1 2>&1 | tail -3 | tr '\n' ' ')"
    done
  else tail -30 /tmp/cmake.log; fi
} 2>&1 | tee "$OUT/tests.txt"
for pass in 1 2; do
  for n in base new; do
    echo "== decode $n pass $pass"
    PYTHONPATH=/tmp/ab-$n python3 bench/bench.py --suite decode --impls flashattn,kvcache,kvcache_paged16,sdpa_cudnn \
      --repeats 20 --out "$OUT/decode-$n-$pass.json" 2>&1 | grep -E "^decode|rror"
  done
done 2>&1 | tee "$OUT/bench.txt"
for n in base new; do
  echo "== decode fp8 $n"
  PYTHONPATH=/tmp/ab-$n python3 bench/bench.py --suite decode --kv-dtype fp8 --impls kvcache,kvcache_paged16 \
    --repeats 20 --out "$OUT/decode-fp8-$n.json" 2>&1 | grep -E "^decode|rror"
done 2>&1 | tee -a "$OUT/bench.txt"
cd "$OUT" && tar czf decode-json.tgz decode-*.json && rm -f decode-*.json
