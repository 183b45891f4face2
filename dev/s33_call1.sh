#!/usr/bin/env bash
# s33 call 1 (GPU machine). (1) The bias / modifier / mask / sparse forward kernels in their final
# s32 form (FastDiv tile coordinates, fetch at the loop top) and the FP8 cache at d64 / d256 through
# the binding: pytest on a 64;128;256 bf16 package (def), memcheck of three forward cases.
# (2) Issue 15 A/B: rcp = 1/l by MUFU.RCP (FLASHATTN_DEV_SM90_FWD_RCP_APPROX, d64;128),
# s3 = the masked d64 short tile at 64 keys and three CTAs per SM (FLASHATTN_DEV_SM90_FWD_SHORT3=64,
# d64), each against def in the same process as cuDNN, two alternating passes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s33logs; mkdir -p $L
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
    --head-dims $3 --seqlens 512,1024,2048,16384 --repeats 20 --out "$OUT/ab-$1-$2.json" 2>&1 |
    grep -E "^bf16 |error" | sed "s/^/$1 /" >>$L/bench.txt; echo "bench $1 $2 $(el)"
}
pt() {  # name files...
  local n=$1; shift
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-def timeout 240 python3 -m pytest "$@" -q -p no:cacheprovider \
    >$L/pytest-$n.log 2>&1; echo "pytest $n rc=$? $(tail -1 $L/pytest-$n.log) $(el)"
}
pipb def "64;128;256" &
pipb rcp "64;128" -DFLASHATTN_DEV_SM90_FWD_RCP_APPROX &
pipb s3 "64" -DFLASHATTN_DEV_SM90_FWD_SHORT3=64 &
wait
grep -h "C751" $L/pip-*.log | sort | uniq -c | head -5
echo "== tests on def $(el)"
pt cuda tests/python/test_cuda.py &
pt bias tests/python/test_bias.py &
pt sparse tests/python/test_block_sparse.py &
pt fp8 tests/python/test_fp8.py &
pt sink_kv tests/python/test_sink.py tests/python/test_kvcache.py &
wait
echo "== memcheck $(el)"
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-def timeout 150 compute-sanitizer --tool memcheck python3 dev/san_cases.py \
  --only fwd_mask_tile,fwd_bias_mask_bits_d64,bwd_sparse_d128 >$L/memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|ok|FAIL' $L/memcheck.log | tr '\n' ' ') $(el)"
echo "== bench $(el)"
bench def 1 64,128; bench rcp 1 64,128; bench s3 1 64
bench s3 2 64; bench rcp 2 64,128; bench def 2 64,128
tar -czf "$OUT/logs.tar.gz" -C $L .
echo "done $(el)"
