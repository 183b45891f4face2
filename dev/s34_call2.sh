#!/usr/bin/env bash
# s34 call 2 (GPU machine): issue 15 after two Q slots became the default (def). bf16 packages:
#   qf   = FLASHATTN_DEV_SM90_FWD_QFIRST (the short kernels' producer issues Q before the first K)
#   m128 = FLASHATTN_DEV_SM90_FWD_SHORT128_MASKED (d128 causal <= 512 rows on the short kernel)
#   tr   = the default with FLASHATTN_DEV_FWD_TRACE (per-tile trace: is Q still waited for?)
# Correctness of qf / m128 (test_cuda under sm90; racecheck / synccheck of the short-row cases),
# then four passes, the order rotated each pass, against cuDNN in each process.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s34logs2; mkdir -p $L
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
san() {  # pkg tool cases
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-$1 timeout 200 compute-sanitizer --tool $2 python3 dev/san_cases.py \
    --only $3 >$L/san-$1-$2.log 2>&1
  echo "san $1 $2 rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-$1-$2.log | tr '\n' ' ') $(el)"
}
pipb def "64;128" &
pipb qf "64;128" -DFLASHATTN_DEV_SM90_FWD_QFIRST &
pipb m128 "128" -DFLASHATTN_DEV_SM90_FWD_SHORT128_MASKED &
pipb tr "64;128" -DFLASHATTN_DEV_FWD_TRACE &
wait
grep -h "C751" $L/pip-*.log | sort | uniq -c | head -5
pt qf cuda-qf tests/python/test_cuda.py -k "64 or 128" &
pt m128 cuda-m128 tests/python/test_cuda.py -k 128 &
pt def cuda-def tests/python/test_cuda.py tests/python/test_sink.py -k "64 or 128" &
san qf racecheck fwd_d64_short_causal,fwd_d128_short_tiles,fwd_d64_short_tiles_causal &
san qf synccheck fwd_d64_short_causal,fwd_d128_short_tiles,fwd_d64_short_tiles_causal &
san m128 racecheck fwd_d128_short_tiles_causal,fwd_d128_short_tiles &
wait
(cd dev && PYTHONPATH=/tmp/ab-tr timeout 100 python3 fwd_trace.py \
  --shapes 4x32x1024x64:causal,8x16x512x128,8x16x512x128:causal >$L/trace.txt 2>&1; echo "trace rc=$? $(el)")
order=(def qf m128)
for p in 1 2 3 4; do
  for i in 0 1 2; do
    k=${order[$(( (i + p) % 3 ))]}
    if [ $k = m128 ]; then bench m128 ab-m128-$p 128 512; else bench $k ab-$k-$p 64,128 512,1024; fi
  done
done
tar -czf "$OUT/logs.tar.gz" -C $L .
python3 dev/ab_table.py $L/ab-def-4.json $L/ab-qf-4.json $L/ab-m128-4.json 2>&1 | tail -10 || true
tail -30 $L/trace.txt
echo "done $(el)"
