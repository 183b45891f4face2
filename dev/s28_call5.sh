#!/usr/bin/env bash
# Session script (s28 call 5, deleted after its run): does call 3's kvcache anomaly (555 us at
# b8 x 64k against flash_attn_func's 485; call 4's probe: 486 / 486) come back? bench.py's decode
# suite with 2026-12-02's peer list, then with the default list (sdpa_math included) and
# --gpu-state, then the 12-02 list again.
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
run() {  # name args...
  local n=$1; shift
  timeout 150 python3 bench/bench.py --suite decode --repeats 10 --out "$OUT/r/dec-$n.json" "$@" >"$OUT/r/dec-$n.log" 2>&1
  echo "$(el) $n rc=$?"; grep "^decode b" "$OUT/r/dec-$n.log" | sed -E 's/ sdpa_(flash|efficient|math)[^)]*\)//g'
}
run list1 --impls flashattn,kvcache,kvcache_paged16,sdpa_cudnn
run default --gpu-state
run list2 --impls flashattn,kvcache,kvcache_paged16,sdpa_cudnn
tar czf "$OUT/s28c5.tgz" -C "$OUT" r && rm -rf "$OUT/r"
