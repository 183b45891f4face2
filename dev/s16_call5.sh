#!/usr/bin/env bash
# s16 call 5 (< 300 s): d64 attn_bias + attn_mask with the mask as bits (FLASHATTN_DEV_SM90_BITS_WITH_BIAS)
# against its mask slot (default): two d64 bf16 packages side by side, test_bias.py under sm90 on
# bits, then dev/bias90_probe.py BHNNm and BHNN (control) at 8 x 2k and 1 x 16k: base, bits, base, bits.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
declare -A flags=([base]="" [bits]="-DFLASHATTN_DEV_SM90_BITS_WITH_BIAS")
for v in base bits; do
  CMAKE_BUILD_PARALLEL_LEVEL=8 timeout 200 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/m-$v \
    -Cbuild-dir=/tmp/bm-$v -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64 \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${flags[$v]}" . > /tmp/logs/pip-$v.log 2>&1 &
done
wait; for v in base bits; do [ -d /tmp/m-$v/flashattn ] || { echo "build $v failed"; grep error /tmp/logs/pip-$v.log | head -5; exit 1; }; done
t built
FLASHATTN_TEST_DEV_BITS_WITH_BIAS=1 FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/m-bits timeout 90 python3 -m pytest \
  tests/python/test_bias.py -q -p no:cacheprovider 2>&1 | tail -3
t tested
for v in base bits base2 bits2; do
  PYTHONPATH=/tmp/m-${v%2} timeout 60 python3 dev/bias90_probe.py --out $OUT/m-$v.json --no-sm80 --head-dims 64 \
    --shapes 8x2048,1x16384 --kinds BHNNm,BHNN > /tmp/logs/p-$v.log 2>&1; t "probe $v rc $?"
  python3 -c "
import json,sys
for r in json.load(open('$OUT/m-$v.json'))['rows']:
    print('$v', r['d'], r['batch'], r['seqlen'], r['kind'], round(r['flashattn_fwd'],1), round(r.get('sdpa_cudnn_fwd') or 0,1), r.get('mask_bits'))"
done
