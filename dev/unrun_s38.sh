#!/usr/bin/env bash
# GPU machine (device tool): what s38 changed without a GPU (dev/NOTES.md to-do 24 (0)), in one
# call of ~5-7 min (not timed): a C++ build (64;128;256, fp16 and bf16, tests) and a package (the
# same head dims, fp16 and bf16) concurrently; then
#   - ctest of the two test fixes (FusedSplitCombine, Sm90BackwardRunsUnpaddedAt192_128) and the
#     layout test, under sm90 and auto, with --output-on-failure;
#   - pytest: test_kvcache -k gqa_tokens_fold (the one-token fold against the token fold), test_cuda's
#     new LONG_SHAPES (masked d128 short rows without keys, the d128 window kernel past 512 rows)
#     in fp16 and bf16 under sm90, test_cuda -k 128 under sm90 in both dtypes (masked d128 short
#     rows' first fp16 run), test_sink;
#   - compute-sanitizer synccheck / racecheck of the masked d128 short kernel's tile cases;
#   - dev/spec_decode_probe.py: the paged split cap for folded steps (predicted: paged b1 x 4k x 4
#     tokens 21.0 -> ~16.6 us, against bench/results/h200-2026-12-05-spec-decode-bf8e838.json).
# Logs in $OUT/unrun38.tar.gz, a summary printed last. dev/fwd_regress_ab.sh is a call of its own.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/unrun38; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pack() { tar -czf "$OUT/unrun38.tar.gz" -C $L . 2>/dev/null; }
( cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    "-DFLASHATTN_CUDA_HEAD_DIMS=64;128;256" >$L/build.log 2>&1 && cmake --build build-gpu -j 8 >>$L/build.log 2>&1
  echo "cmake rc=$? $(el)" ) &
( CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/fa38 \
    -Cbuild-dir=build-fa38 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" . >$L/pip.log 2>&1; echo "pip rc=$? $(el)" ) &
wait
pack
for path in sm90 auto; do
  ( FLASHATTN_CUDA_PATH=$path timeout 200 ctest --test-dir build-gpu -j 4 --output-on-failure \
      -R "FusedSplitCombine|Sm90BackwardRunsUnpaddedAt192_128|Sm90FwdTile|GqaTokensFolded" >$L/ctest-$path.log 2>&1
    echo "ctest $path rc=$? $(grep -E 'tests passed|tests failed' $L/ctest-$path.log) $(el)" ) &
done
( export PYTHONPATH=/tmp/fa38 FLASHATTN_CUDA_PATH=sm90
  timeout 300 python3 -m pytest tests/python/test_kvcache.py -k gqa_tokens_fold -q -p no:cacheprovider >$L/pytest-fold.log 2>&1
  echo "pytest fold rc=$? $(tail -1 $L/pytest-fold.log) $(el)"
  timeout 300 python3 -m pytest tests/python/test_cuda.py tests/python/test_sink.py -k "128" -q -p no:cacheprovider \
    >$L/pytest-128.log 2>&1
  echo "pytest -k 128 (sm90, both dtypes) rc=$? $(tail -1 $L/pytest-128.log) $(el)" ) &
( export PYTHONPATH=/tmp/fa38 FLASHATTN_CUDA_PATH=sm90
  for tool in synccheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool python3 dev/san_cases.py \
      --only fwd_d128_short_tiles_causal,fwd_d128_short_tiles_causal_nokeys,fwd_d128_window_tiles_causal >$L/san-$tool.log 2>&1
    echo "$tool rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-$tool.log | tr '\n' ' ') $(el)"
  done ) &
wait
grep -E "Failed|FAILED|Error" $L/ctest-*.log $L/pytest-*.log | head -12
pack
PYTHONPATH=/tmp/fa38:dev timeout 150 python3 dev/spec_decode_probe.py --out $L/spec-decode.json >$L/spec.txt 2>&1
echo "spec decode rc=$? $(el)"; tail -14 $L/spec.txt
pack
echo "done $(el)"
