#!/usr/bin/env bash
# s33 call 3 (GPU machine): the new default (d64 masked short tile 64 x 64 at three CTAs per SM;
# 1/l by MUFU.RCP in every sm90 forward) on a 64;128;256 bf16 package (def): pytest of every
# forward family under sm90, racecheck / synccheck / memcheck of the short-row cases, the forward
# record (d64-d256, 512-16k, two passes with cuDNN). Then two d64 A/Bs, three alternating passes:
#   nm1 = the one-consumer tile for unmasked short rows too (SHORT_ONE_NOMASK)
#   m4k = the masked short tile up to 4096 rows (SHORT_MASKED_MAX=4096)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s33logs3; mkdir -p $L
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
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-$k timeout 240 python3 -m pytest "$@" -q -p no:cacheprovider \
    >$L/pytest-$n.log 2>&1; echo "pytest $n rc=$? $(tail -1 $L/pytest-$n.log) $(el)"
}
san() {  # tool
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-def timeout 200 compute-sanitizer --tool $1 python3 dev/san_cases.py \
    --only fwd_d64_short_causal,fwd_d256_short_causal,bwd_varlen_causal_d64 >$L/san-$1.log 2>&1
  echo "$1 rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-$1.log | tr '\n' ' ') $(el)"
}
pipb def "64;128;256" &
pipb nm1 "64" -DFLASHATTN_DEV_SM90_FWD_SHORT_ONE_NOMASK &
pipb m4k "64" -DFLASHATTN_DEV_SM90_FWD_SHORT_MASKED_MAX=4096 &
wait
grep -h "C751" $L/pip-*.log | sort | uniq -c | head -5
pt def cuda tests/python/test_cuda.py &
pt def bias tests/python/test_bias.py &
pt def sparse tests/python/test_block_sparse.py &
pt def fp8 tests/python/test_fp8.py &
pt def sink_kv tests/python/test_sink.py tests/python/test_kvcache.py tests/python/test_torch.py &
pt nm1 cuda-nm1 tests/python/test_cuda.py -k 64 &
pt m4k cuda-m4k tests/python/test_cuda.py -k 64 &
wait
san racecheck; san synccheck; san memcheck
for p in 1 2; do bench def rec-$p 64,128,256 512,1024,2048,16384; done
for p in 1 2 3; do
  bench def ab-def-$p 64 512,1024,2048,4096; bench nm1 ab-nm1-$p 64 512,1024; bench m4k ab-m4k-$p 64 2048,4096
done
tar -czf "$OUT/logs.tar.gz" -C $L .
echo "done $(el)"
