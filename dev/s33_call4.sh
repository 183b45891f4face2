#!/usr/bin/env bash
# s33 call 4 (GPU machine): d128 short rows (issue 15), A/B against the default (def, 64;128),
# four alternating passes with cuDNN, d128 512 / 1024:
#   x128 = the d128 short kernel on the cross-tile pipeline (two Q buffers beside the ones panels)
#          and up to 1024 rows (SHORT128_CROSS, SHORT128_MAX=1024)
#   m128 = causal / window d128 up to 512 rows on the short kernel too (row sums on the tensor
#          cores; SHORT128_MASKED with the untracked sm90fwdshort_hdim128_bf16_window.cu)
# test_cuda -k 128 on both, racecheck / synccheck of a 1024-row d128 case on x128, and the
# per-tile trace of the new default (tr = FWD_TRACE) at d64 causal 1k and d128 512 / causal 512.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s33logs4; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pipb() {  # name head_dims [cuda flags]
  ( CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$2" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 ${3:+-Ccmake.define.CMAKE_CUDA_FLAGS="$3"} . >"$L/pip-$1.log" 2>&1 )
  echo "pip $1 rc=$? $(el)"
}
bench() {  # name tag
  PYTHONPATH=/tmp/ab-$1 python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 --no-backward \
    --head-dims 128 --seqlens 512,1024 --repeats 30 --out "$L/$2.json" >>$L/bench.txt 2>&1
  echo "bench $2 rc=$? $(el)"
}
pt() {  # pkg
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-$1 timeout 200 python3 -m pytest tests/python/test_cuda.py -k 128 -q \
    -p no:cacheprovider >$L/pytest-$1.log 2>&1; echo "pytest $1 rc=$? $(tail -1 $L/pytest-$1.log) $(el)"
}
pipb def "64;128" &
pipb x128 "128" "-DFLASHATTN_DEV_SM90_FWD_SHORT128_CROSS -DFLASHATTN_DEV_SM90_FWD_SHORT128_MAX=1024" &
pipb m128 "128" -DFLASHATTN_DEV_SM90_FWD_SHORT128_MASKED &
pipb tr "64;128" -DFLASHATTN_DEV_FWD_TRACE &
wait
grep -h "C751" $L/pip-*.log | sort | uniq -c | head -5
pt x128 & pt m128 & wait
for tool in racecheck synccheck; do
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-x128 timeout 120 compute-sanitizer --tool $tool python3 dev/san_cases.py \
    --only bwd_d128 >$L/san-$tool.log 2>&1
  echo "$tool x128 rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-$tool.log | tr '\n' ' ') $(el)"
done
(cd dev && PYTHONPATH=/tmp/ab-tr timeout 120 python3 fwd_trace.py \
  --shapes 4x32x1024x64:causal,8x16x512x128,8x16x512x128:causal >$L/trace.txt 2>&1; echo "trace rc=$? $(el)")
for p in 1 2; do
  bench def def-$p; bench x128 x128-$p; bench m128 m128-$p
  q=$((p + 2)); bench m128 m128-$q; bench x128 x128-$q; bench def def-$q
done
tar -czf "$OUT/logs.tar.gz" -C $L .
echo "done $(el)"
