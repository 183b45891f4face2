#!/usr/bin/env bash
# s34 call 1 (GPU machine): to-do 19 (a). Three d64;128 bf16 packages:
#   base = the default; q2 = FLASHATTN_DEV_SM90_FWD_Q2; dq = DEFER_STORE + Q2.
# Correctness of dq first (test_cuda -k "64 or 128" under sm90, incl. the new LONG_SHAPES; racecheck /
# synccheck of the short-row cases with several tiles per CTA), the base's new LONG_SHAPES too; then
# four alternating passes of d64 / d128 at 512 / 1024 against cuDNN in each process.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s34logs1; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pipb() {  # name head_dims [cuda flags]
  ( CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$2" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 ${3:+-Ccmake.define.CMAKE_CUDA_FLAGS="$3"} . >"$L/pip-$1.log" 2>&1 )
  echo "pip $1 rc=$? $(el)"
}
bench() {  # name tag head_dims seqlens
  PYTHONPATH=/tmp/ab-$1 python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 --no-backward \
    --head-dims $3 --seqlens $4 --repeats 30 --out "$L/$2.json" >>$L/bench.txt 2>&1
  echo "bench $2 rc=$? $(el)"
}
pt() {  # pkg name files/args...
  local k=$1 n=$2; shift 2
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-$k timeout 200 python3 -m pytest "$@" -q -p no:cacheprovider \
    >$L/pytest-$n.log 2>&1; echo "pytest $n rc=$? $(tail -1 $L/pytest-$n.log) $(el)"
}
san() {  # pkg tool
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-$1 timeout 200 compute-sanitizer --tool $2 python3 dev/san_cases.py \
    --only fwd_d64_short_causal,fwd_d128_short,fwd_d128_short_tiles,fwd_d64_short_tiles_causal >$L/san-$1-$2.log 2>&1
  echo "san $1 $2 rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-$1-$2.log | tr '\n' ' ') $(el)"
}
pipb base "64;128" &
pipb q2 "64;128" -DFLASHATTN_DEV_SM90_FWD_Q2 &
pipb dq "64;128" "-DFLASHATTN_DEV_SM90_FWD_Q2 -DFLASHATTN_DEV_SM90_FWD_DEFER_STORE" &
wait
grep -h "C751\|spill" $L/pip-*.log | sort | uniq -c | head -5
pt dq cuda-dq tests/python/test_cuda.py -k "64 or 128" &
pt base cuda-base-long tests/python/test_cuda.py -k "sq500 or sq1000_sk600" &
pt q2 cuda-q2 tests/python/test_cuda.py -k "64 or 128" &
san dq racecheck &
san dq synccheck &
wait
for p in 1 2 3 4; do
  for k in base q2 dq; do bench $k ab-$k-$p 64,128 512,1024; done
done
tar -czf "$OUT/logs.tar.gz" -C $L .
python3 dev/ab_table.py $L/ab-base-4.json $L/ab-q2-4.json $L/ab-dq-4.json 2>&1 | tail -12 || true
echo "done $(el)"
