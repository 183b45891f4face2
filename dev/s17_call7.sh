#!/usr/bin/env bash
# s17 call 7 (written, not run; < 300 s, from the repo root): the split-role dK/dV kernel's role
# pipelining (kPipe, default at 192/128 since s17) at d192 and d256 too
# (-DFLASHATTN_DEV_SM90_BWD_SPLIT_PIPE_ALL; ptxas: 0 spills, a wait only at the loop exit) against
# the default: two 192;256 bf16 packages, test_cuda (192 / 256 / head_dim_v) under sm90 and the
# synccheck of san_cases' 192/128 case on pipeall, bench.py d256 at 2k / 8k and dv_probe (192/128
# must not move), base, pipeall, base, pipeall.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
declare -A flags=([base]="" [pipeall]="-DFLASHATTN_DEV_SM90_BWD_SPLIT_PIPE_ALL")
for v in base pipeall; do
  CMAKE_BUILD_PARALLEL_LEVEL=8 timeout 200 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/m-$v \
    -Cbuild-dir=/tmp/bm-$v -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=192;256" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${flags[$v]}" . > /tmp/logs/pip-$v.log 2>&1 &
done
wait; for v in base pipeall; do [ -d /tmp/m-$v/flashattn ] || { echo "build $v failed"; exit 1; }; done; t built
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/m-pipeall timeout 100 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider \
  -k "192 or 256 or head_dim_v" > /tmp/logs/py.log 2>&1; echo "test_cuda sm90 pipeall: $(tail -1 /tmp/logs/py.log)"
FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/m-pipeall timeout 60 compute-sanitizer --tool synccheck --error-exitcode 9 \
  python3 dev/san_cases.py --only bwd_192_128_causal > /tmp/logs/san.log 2>&1; echo "synccheck: rc=$? $(tail -1 /tmp/logs/san.log)"
t tested
for v in base pipeall base2 pipeall2; do
  PYTHONPATH=/tmp/m-${v%2} timeout 60 python3 bench/bench.py --suite issue3 --impls flashattn,sdpa_cudnn --dtypes bf16 \
    --head-dims 256 --seqlens 2048,8192 --repeats 10 --out $OUT/b-$v.json > /tmp/logs/b-$v.log 2>&1
  t "$v"; grep -E "^bf16" /tmp/logs/b-$v.log | sed -E 's/ +/ /g' | cut -c1-120
done
