#!/usr/bin/env bash
# s33 call 2 (GPU machine): issue 15's tile boundary, A/B of three dev variants against the
# default, short rows only, four alternating passes, each in one process with cuDNN:
#   rs   = 1/l by MUFU.RCP (RCP_APPROX) + the masked d64 short tile at 64 keys, 3 CTAs/SM (SHORT3=64)
#   rs8  = rs + one butterfly round and 8-byte O stores (STORE8)
#   s3s  = rs with three K/V stages in the d64 short tile (d64 only)
# test_cuda (sm90) and racecheck of the short causal cases on rs8 first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s33logs2; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pipb() {  # name head_dims [cuda flags]
  ( CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$2" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 ${3:+-Ccmake.define.CMAKE_CUDA_FLAGS="$3"} . >"$L/pip-$1.log" 2>&1 )
  echo "pip $1 rc=$? $(el)"
}
bench() {  # name pass head_dims
  PYTHONPATH=/tmp/ab-$1 python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 --no-backward \
    --head-dims $3 --seqlens 512,1024,2048 --repeats 30 --out "$L/ab-$1-$2.json" >>$L/bench.txt 2>&1
  echo "bench $1 $2 rc=$? $(el)"
}
R="-DFLASHATTN_DEV_SM90_FWD_RCP_APPROX -DFLASHATTN_DEV_SM90_FWD_SHORT3=64"
pipb def "64;128" &
pipb rs "64;128" "$R" &
pipb rs8 "64;128" "$R -DFLASHATTN_DEV_SM90_FWD_STORE8" &
pipb s3s "64" "$R -DFLASHATTN_DEV_SM90_FWD_SHORT3_STAGES=3" &
wait
grep -h "C751" $L/pip-*.log | sort | uniq -c | head -5
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-rs8 timeout 200 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider \
  >$L/pytest-rs8.log 2>&1; echo "pytest rs8 rc=$? $(tail -1 $L/pytest-rs8.log) $(el)"
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-s3s timeout 200 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider \
  -k "64" >$L/pytest-s3s.log 2>&1; echo "pytest s3s rc=$? $(tail -1 $L/pytest-s3s.log) $(el)"
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-rs8 timeout 120 compute-sanitizer --tool racecheck python3 dev/san_cases.py \
  --only fwd_d64_short_causal,bwd_varlen_causal_d64 >$L/racecheck.log 2>&1
echo "racecheck rs8 rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|FAIL' $L/racecheck.log | tr '\n' ' ') $(el)"
for p in 1 2; do
  bench def $p 64,128; bench rs $p 64,128; bench rs8 $p 64,128; bench s3s $p 64
  q=$((p + 2)); bench s3s $q 64; bench rs8 $q 64,128; bench rs $q 64,128; bench def $q 64,128
done
tar -czf "$OUT/logs.tar.gz" -C $L .
echo "done $(el)"
