#!/usr/bin/env bash
# Session script (s28 call 7, deleted after its run): which decode peer, run before it in the
# suite, slows kvcache (call 5): the suite with flashattn,kvcache plus one of sdpa_flash,
# sdpa_efficient, sdpa_math each.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
if [ ! -d /tmp/ab-m/flashattn ]; then
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-m \
  -Cbuild-dir=build-ab-m -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128;576" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
fi
echo "$(el) built"
export PYTHONPATH=/tmp/ab-m
for extra in sdpa_efficient sdpa_flash sdpa_math; do
  timeout 100 python3 bench/bench.py --suite decode --repeats 10 --impls flashattn,kvcache,$extra \
    --out "$OUT/r/dec-$extra.json" >"$OUT/r/dec-$extra.log" 2>&1
  echo "$(el) +$extra rc=$?"; grep "^decode b" "$OUT/r/dec-$extra.log" | sed -E 's/ sdpa_(flash|efficient|math).*$//'
  grep -m2 -i "error\|unavailable" "$OUT/r/dec-$extra.log"
done
tar czf "$OUT/s28c7.tgz" -C "$OUT" r && rm -rf "$OUT/r"
