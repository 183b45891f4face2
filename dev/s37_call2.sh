#!/usr/bin/env bash
# GPU machine (device tool), s37's second call: what the first call (dev/unrun_check.sh) left
# unrun or failed on. ~450 s predicted.
#   - ctest -R "KVCache|PagedVarlen|CApi|SeqExtent|Special" of a bf16 64;128;256 build (the
#     package's build folder with the gtests) under auto and sm90 (the first call's 200 s cap
#     stopped both at 530 of 1201 tests; none of those 530 failed).
#   - pytest: test_cuda -k "bad_device or varlen" and test_paged_varlen under sm80 and auto (the
#     bad cu_seqlens test rewritten; the varlen GQA fold), test_kvcache under sm80 (two cases fixed).
#   - memcheck of dev/san_cases.py varlen_bad_cu / _d64 (rewritten), varlen_bad_cu_fold,
#     paged_varlen_decode (now folded) under auto and sm80; racecheck of the folded varlen cases.
#   - dev/spec_decode_probe.py with device timing (the first call's was eager), and the decode
#     suite's kvcache_paged16 / varlen_paged16 (vLLM's call, folded now).
# Logs in $OUT/call2.tar.gz, a summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/call2-logs; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pack() { tar -czf "$OUT/call2.tar.gz" -C $L . 2>/dev/null; }
# One build: the bf16 package with the gtests in its build folder (ctest runs there; the fp16
# cases skip as not built).
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/fa-def \
  -Cbuild-dir=build-fa-def -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_BUILD_TESTS=ON \
  "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >$L/pip.log 2>&1
echo "pip rc=$? $(el)"
pack
for path in auto sm90; do
  ( FLASHATTN_CUDA_PATH=$path timeout ${CTEST_S:-200} ctest --test-dir build-fa-def -j 6 --output-on-failure \
      -R "KVCache|PagedVarlen|CApi|SeqExtent|Special" -LE "^(large|install)\$" >$L/ctest-$path.log 2>&1
    echo "ctest $path rc=$? $(grep -E 'tests passed|tests failed' $L/ctest-$path.log) $(el)" ) &
done
( export PYTHONPATH=/tmp/fa-def
  for path in sm80 auto; do
    FLASHATTN_CUDA_PATH=$path timeout 170 python3 -m pytest tests/python/test_cuda.py -k "bad_device or varlen" \
      tests/python/test_paged_varlen.py $([ $path = sm80 ] && echo tests/python/test_kvcache.py) \
      -q -rs -p no:cacheprovider >$L/pytest-$path.log 2>&1
    echo "pytest $path rc=$? $(tail -1 $L/pytest-$path.log) $(el)"
  done ) &
( export PYTHONPATH=/tmp/fa-def
  for path in auto sm80; do
    cases=varlen_bad_cu,varlen_bad_cu_d64,varlen_bad_cu_fold
    [ $path = auto ] && cases=$cases,paged_varlen_decode
    FLASHATTN_CUDA_PATH=$path PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 120 compute-sanitizer --tool memcheck \
      python3 dev/san_cases.py --only $cases >$L/san-memcheck-$path.log 2>&1
    echo "memcheck $path rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-memcheck-$path.log | tr '\n' ' ') $(el)"
  done
  PYTHONPATH=/tmp/fa-def timeout 100 compute-sanitizer --tool racecheck python3 dev/san_cases.py \
    --only varlen_bad_cu_fold,paged_varlen_decode >$L/san-racecheck.log 2>&1
  echo "racecheck rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-racecheck.log | tr '\n' ' ') $(el)" ) &
wait
grep -hE "^\s*[0-9]+/[0-9]+ Test.*(Failed|Timeout|Exception)" $L/ctest-*.log | head -10
grep -hE "^(FAILED|ERROR)" $L/pytest-*.log | head -10
pack
# vLLM's decode call (varlen with a block table) now folded: against the cache call, one process.
PYTHONPATH=/tmp/fa-def timeout 90 python3 bench/bench.py --suite decode --impls kvcache_paged16,varlen_paged16 \
  --repeats 20 --out $L/decode-varlen.json >$L/decode-varlen.txt 2>&1
echo "decode varlen rc=$? $(el)"; grep "^decode" $L/decode-varlen.txt
pack
PYTHONPATH=/tmp/fa-def:dev timeout 100 python3 dev/spec_decode_probe.py --repeats 20 --out $L/spec-device.json \
  >$L/spec.txt 2>&1
echo "spec rc=$? $(el)"; cut -c1-300 $L/spec.txt
pack
echo "done $(el)"
