#!/usr/bin/env bash
# Ninth session, first GPU call: main (3a87ede) has host refactors that never ran on a GPU
# (fwd_grid.h, empty_forward, block_needs_mask): the sm90 ctest labels on it; racecheck of the
# sparse Hopper forward with its full log kept; the XOR quad-transpose epilogue A/B at 512-16k
# (FLASHATTN_DEV_SM90_FWD_XOR_TRANSPOSE, two packages built side by side).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
PIP="python3 -m pip install --no-build-isolation --no-deps -q"
DEF="-Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16"
(CMAKE_BUILD_PARALLEL_LEVEL=10 $PIP --target /tmp/pk -Cbuild-dir=/tmp/bb $DEF -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > /tmp/pip.log 2>&1 \
  || { echo "main build failed"; grep -E "error" /tmp/pip.log | head; }) &
(CMAKE_BUILD_PARALLEL_LEVEL=6 $PIP --target /tmp/pkx -Cbuild-dir=/tmp/bbx $DEF \
  -Ccmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_SM90_FWD_XOR_TRANSPOSE . > /tmp/pipx.log 2>&1 \
  || { echo "xor build failed"; grep -E "error" /tmp/pipx.log | head; }) &
wait; t "packages built"
cmake --build /tmp/bb -j 16 > /tmp/gt.log 2>&1 || grep -E "error" /tmp/gt.log | head -5
t "gtests built"
(FLASHATTN_CUDA_PATH=sm90 ctest --test-dir /tmp/bb -j 6 --timeout 110 -L "sparse|bias|fp8|correctness|special" > /tmp/ct-sm90.log 2>&1
 echo "ctest sm90 sparse|bias|fp8|correctness|special: $(grep -E 'tests passed|tests failed' /tmp/ct-sm90.log)"
 grep -E "\(Failed\)|Timeout|SEGFAULT|Exception" /tmp/ct-sm90.log | head) &
(PYTHONPATH=/tmp/pkx FLASHATTN_CUDA_PATH=sm90 timeout 200 python3 -m pytest tests/python/test_cuda.py -q -x -p no:cacheprovider > /tmp/pyx.log 2>&1
 echo "xor variant test_cuda.py (sm90): $(tail -1 /tmp/pyx.log)") &
wait; t "ctest + xor pytest"
cp /tmp/ct-sm90.log $OUT/ 2>/dev/null
SP=$(find /tmp/bb -name flashattn_test_sparse -type f | head -1)
C=All/SparseSm90.MatchesReference
F=$C/sm90_varlen_lists_causal_ragged:$C/sm90_dense_64x192_window:$C/sm90_lists_128x64_softcap_alibi_gqa
FLASHATTN_CUDA_PATH=sm90 timeout 90 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 40 $SP \
  --gtest_filter="$F" > $OUT/san-racecheck-sparse.txt 2>&1
echo "racecheck sparse: rc $? $(grep -E 'RACECHECK SUMMARY' $OUT/san-racecheck-sparse.txt | tail -1)"
t "racecheck"
B="--suite full --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,2048,16384 --impls flashattn,sdpa_cudnn --no-backward --repeats 20"
PYTHONPATH=/tmp/pk timeout 150 python3 bench/bench.py $B --out $OUT/xor-base.json 2>&1 | grep -E "^bf16" > /tmp/b0.txt
PYTHONPATH=/tmp/pkx timeout 150 python3 bench/bench.py $B --out $OUT/xor-x.json 2>&1 | grep -E "^bf16" > /tmp/b1.txt
t "bench"
python3 - $OUT/xor-base.json $OUT/xor-x.json <<'PY'
import json, sys
def rows(p):
    d = json.load(open(p)); out = {}
    for r in d["rows"]:
        k = (r["d"], r["n"], r["causal"])
        f = r.get("flashattn", {}).get("fwd_tflops"); c = r.get("sdpa_cudnn", {}).get("fwd_tflops")
        out[k] = (f, c)
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
print("d    N      causal  base   xor    x/base  base/cudnn xor/cudnn")
for k in sorted(a):
    fa, ca = a[k]; fb, cb = b.get(k, (None, None))
    if fa and fb:
        print(f"{k[0]:<4} {k[1]:<6} {str(k[2]):<7} {fa:6.1f} {fb:6.1f} {fb/fa:6.3f}  {fa/ca:6.3f}     {fb/cb:6.3f}")
PY
