#!/usr/bin/env bash
# s16 call 5 (< 330 s, from the repo root): two d64;128 bf16 packages side by side.
#  1. d64 attn_bias + attn_mask with the mask as bits (bits: -DFLASHATTN_DEV_SM90_BITS_WITH_BIAS)
#     against its mask slot (base): test_bias.py under sm90 on bits (FLASHATTN_TEST_DEV_BITS_WITH_BIAS=1),
#     dev/bias90_probe.py BHNNm and BHNN (control) at d64 8 x 2k and 1 x 16k: base, bits, base, bits.
#  2. The decode split model with the merge term (split_heuristic.h kDecodeMerge, in both
#     packages): test_kvcache.py and test_cuda.py -k "decode or split or graph" on base, then
#     dev/decode_splits.py (s0 = the model's choice against fixed counts).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
declare -A flags=([base]="" [bits]="-DFLASHATTN_DEV_SM90_BITS_WITH_BIAS")
for v in base bits; do
  CMAKE_BUILD_PARALLEL_LEVEL=8 timeout 220 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/m-$v \
    -Cbuild-dir=/tmp/bm-$v -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${flags[$v]}" . > /tmp/logs/pip-$v.log 2>&1 &
done
wait; for v in base bits; do [ -d /tmp/m-$v/flashattn ] || { echo "build $v failed"; grep error /tmp/logs/pip-$v.log | head -5; exit 1; }; done
t built
(FLASHATTN_TEST_DEV_BITS_WITH_BIAS=1 FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/m-bits timeout 100 python3 -m pytest \
  tests/python/test_bias.py -q -p no:cacheprovider > /tmp/logs/py-bits.log 2>&1) &
(PYTHONPATH=/tmp/m-base timeout 100 python3 -m pytest tests/python/test_kvcache.py -q -p no:cacheprovider > /tmp/logs/py-kv.log 2>&1) &
(PYTHONPATH=/tmp/m-base timeout 100 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider -k "decode or split or graph" \
  > /tmp/logs/py-cuda.log 2>&1) &
wait; t tested
echo "test_bias (bits, sm90): $(tail -1 /tmp/logs/py-bits.log)"; grep -E "^FAILED" /tmp/logs/py-bits.log | head -5
echo "test_kvcache (base): $(tail -1 /tmp/logs/py-kv.log)"; grep -E "^FAILED" /tmp/logs/py-kv.log | head -5
echo "test_cuda decode/split/graph (base): $(tail -1 /tmp/logs/py-cuda.log)"; grep -E "^FAILED" /tmp/logs/py-cuda.log | head -5
PYTHONPATH=/tmp/m-base timeout 60 python3 dev/decode_splits.py --shapes 1x4096,1x16384,8x65536,64x4096 --splits 0,3,6,8,16,32 \
  --out $OUT/dec-splits.json > /tmp/logs/dec.log 2>&1; t "decode rc $?"; tail -4 /tmp/logs/dec.log
for v in base bits base2 bits2; do
  PYTHONPATH=/tmp/m-${v%2} timeout 60 python3 dev/bias90_probe.py --out $OUT/m-$v.json --no-sm80 --head-dims 64 \
    --shapes 8x2048,1x16384 --kinds BHNNm,BHNN > /tmp/logs/p-$v.log 2>&1; t "probe $v rc $?"
  python3 -c "
import json
for r in json.load(open('$OUT/m-$v.json'))['rows']:
    print('$v', r['d'], r['batch'], r['seqlen'], r['kind'], round(r['flashattn_fwd'],1), round(r.get('sdpa_cudnn_fwd') or 0,1), r.get('mask_bits'))"
done
tar czf $OUT/logs.tgz -C /tmp/logs .
