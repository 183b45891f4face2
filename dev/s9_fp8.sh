#!/usr/bin/env bash
# Ninth session, third GPU call: the FP8 forward's tile sweep (dev/fp8_tile_sweep.sh; four
# candidates), and on its "base" package (HEAD: butterfly transpose, d64 chunked O, lane-0 reads
# of the sparse kernel's shared words) test_cuda.py, test_block_sparse.py and test_fp8.py.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
export JOBS_EACH=4
OUT_FINAL=$OUT
OUT=/tmp/fo STEPS=build ONLY="base d128_bn192 d256_bn128_r240 d64_c3" bash dev/fp8_tile_sweep.sh
t "built"
export PYTHONPATH=$PWD/build-fp8t-pkg-base
(FLASHATTN_CUDA_PATH=sm90 timeout 200 python3 -m pytest tests/python/test_cuda.py tests/python/test_block_sparse.py -q -p no:cacheprovider > /tmp/fo/py-base.log 2>&1
 echo "base test_cuda + test_block_sparse (sm90): $(tail -1 /tmp/fo/py-base.log)") &
(timeout 200 python3 -m pytest tests/python/test_fp8.py tests/python/test_block_sparse.py -q -p no:cacheprovider > /tmp/fo/py-fp8.log 2>&1
 echo "base test_fp8 + test_block_sparse (auto): $(tail -1 /tmp/fo/py-fp8.log)") &
wait; t "base tests"
unset PYTHONPATH
OUT=/tmp/fo STEPS="test bench" ONLY="base d128_bn192 d256_bn128_r240 d64_c3" bash dev/fp8_tile_sweep.sh
cp /tmp/fo/fp8-tile-*.json $OUT_FINAL/ 2>/dev/null
tar czf $OUT_FINAL/fp8-logs.tgz -C /tmp/fo $(cd /tmp/fo && ls *.test *.log 2>/dev/null)
for f in /tmp/fo/fp8-tile-*.json; do python3 - "$f" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    a, b = r.get("flashattn", {}), r.get("flashattn_fp8", {})
    if "fwd_tflops" in b:
        print(f"{os.path.basename(sys.argv[1])[9:-5]:<18} d{r['d']:<4} {r['n']:<6} causal={str(r['causal']):<5} bf16 {a.get('fwd_tflops', 0):6.1f}  fp8 {b['fwd_tflops']:6.1f}")
PY
done
