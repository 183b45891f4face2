#!/usr/bin/env bash
# Session script (s28 call 3, deleted after its run): the committed tree (paged MLA on TMA by
# default) as one package (128;576 bf16): test_mla / test_kvcache, then bench.py's mla and decode
# suites for bench/results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-m \
  -Cbuild-dir=build-ab-m -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128;576" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
echo "$(el) built"
export PYTHONPATH=/tmp/ab-m
timeout 200 python3 -m pytest tests/python/test_mla.py tests/python/test_kvcache.py -q -p no:cacheprovider >"$OUT/r/pytest.log" 2>&1
echo "$(el) pytest rc=$?: $(tail -1 "$OUT/r/pytest.log")"
timeout 240 python3 bench/bench.py --suite mla --repeats 10 --out "$OUT/r/mla.json" >"$OUT/r/mla.log" 2>&1
echo "$(el) mla rc=$?"; grep "^mla b" "$OUT/r/mla.log" | head -30
timeout 150 python3 bench/bench.py --suite decode --repeats 10 --out "$OUT/r/decode.json" >"$OUT/r/decode.log" 2>&1
echo "$(el) decode rc=$?"; tail -12 "$OUT/r/decode.log"
tar czf "$OUT/s28c3.tgz" -C "$OUT" r && rm -rf "$OUT/r"
