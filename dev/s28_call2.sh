#!/usr/bin/env bash
# Session script (s28 call 2, on call 1's warm machine; deleted after its run): flashattn_test_sparse
# (built in call 1 with -DFLASHATTN_DEV_SM90_SPARSE_BWD_PERSISTENT) in four shards under sm90 and
# auto; compute-sanitizer on mlap's paged TMA cases and spp's sparse backward cases.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
for path in sm90 auto; do
  for i in 0 1 2 3; do
    FLASHATTN_CUDA_PATH=$path GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i timeout 200 \
      build-t/tests/cpp/flashattn_test_sparse >"$OUT/r/gt-$path-$i.log" 2>&1 &
  done
  wait
  for i in 0 1 2 3; do echo "gtest sparse $path shard $i: $(grep -E '^\[  (PASSED|FAILED)  \]|tests ran' "$OUT/r/gt-$path-$i.log" | tr '\n' ' ')"; done
  grep -h "^\[  FAILED  \] [A-Z]" "$OUT"/r/gt-$path-*.log | head -5
  echo "$(el) gtests $path"
done
# Sanitizers: mlap's paged TMA case (test_mla's page-64 case), spp's sparse backward cases.
for tool in memcheck racecheck synccheck; do
  PYTHONPATH=/tmp/ab-mlap timeout 120 compute-sanitizer --tool $tool python3 -m pytest tests/python/test_mla.py -q \
    -p no:cacheprovider -k "page_size64 or page_size256" >"$OUT/r/san-mla-$tool.log" 2>&1
  echo "mlap $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$OUT/r/san-mla-$tool.log" | tr '\n' ' ')"
done
for tool in racecheck synccheck memcheck; do
  PYTHONPATH=/tmp/ab-spp FLASHATTN_CUDA_PATH=sm90 timeout 150 compute-sanitizer --tool $tool python3 dev/san_cases.py \
    --only bwd_sparse_d128,bwd_sparse_d64 >"$OUT/r/san-sp-$tool.log" 2>&1
  echo "spp $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ALL OK|SOME FAILED' "$OUT/r/san-sp-$tool.log" | tr '\n' ' ')"
  grep -E "Race reported|Invalid|Barrier" "$OUT/r/san-sp-$tool.log" | sort | uniq -c | head -4
done
echo "$(el) sanitizers"

echo "total $(el)"
tar czf "$OUT/s28c2.tgz" -C "$OUT" r && rm -rf "$OUT/r"
