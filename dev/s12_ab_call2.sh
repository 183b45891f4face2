#!/usr/bin/env bash
# Twelfth session (s12), GPU call 2 (one H200, < 430 s), run from .carry/snap with .carry/fa4a beside it
# (kept in /tmp/fa4w for a third call that would install FlashAttention-4: not run, no device time left):
#  1. packages d64;128 bf16 side by side: base (this tree's defaults: the 16-byte dQ conversion
#     and dK/dV stores), x1 and x2 (two CTAs per SM for the short-row forward, fwd_tile.h
#     ctas_per_sm): x1 = d64 short rows {1 consumer, 128 keys, 2 stages} and d128 {1, 64, 2};
#     x2 = d64 short rows {1, 128, 3} and d128 {1, 80, 2};
#  2. pytest test_cuda + test_torch under sm90 on base, test_cuda under sm90 on x1 and x2;
#     racecheck and memcheck of the backward cases of dev/san_cases.py on base (the stores shuffle);
#  3. dev/kernel_split.py of the backward on base (call 1's shapes); the full suite on base
#     (forward and backward, against cuDNN); forward-only suites x1, x2, base again.
# Writes $OUT/{split-bwd,full,ctas-*}.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 420 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/fa4w
[ -d ../fa4a ] && cp ../fa4a/* /tmp/fa4w/ && t "fa4a kept: $(ls /tmp/fa4w | wc -l) files"
PIP="python3 -m pip install --no-build-isolation --no-deps -q -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128"
X1="-DFLASHATTN_DEV_SM90_SHORT_CONSUMERS=1 -DFLASHATTN_DEV_SM90_SHORT_BN=128 -DFLASHATTN_DEV_SM90_SHORT_STAGES=2 -DFLASHATTN_DEV_SM90_SHORT_PINGPONG=0 -DFLASHATTN_DEV_SM90_SHORT_CTAS=2 -DFLASHATTN_DEV_SM90_HDIM=128 -DFLASHATTN_DEV_SM90_CONSUMERS=1 -DFLASHATTN_DEV_SM90_BN=64 -DFLASHATTN_DEV_SM90_STAGES=2 -DFLASHATTN_DEV_SM90_PINGPONG=0 -DFLASHATTN_DEV_SM90_CTAS=2"
X2="-DFLASHATTN_DEV_SM90_SHORT_CONSUMERS=1 -DFLASHATTN_DEV_SM90_SHORT_BN=128 -DFLASHATTN_DEV_SM90_SHORT_STAGES=3 -DFLASHATTN_DEV_SM90_SHORT_PINGPONG=0 -DFLASHATTN_DEV_SM90_SHORT_CTAS=2 -DFLASHATTN_DEV_SM90_HDIM=128 -DFLASHATTN_DEV_SM90_CONSUMERS=1 -DFLASHATTN_DEV_SM90_BN=80 -DFLASHATTN_DEV_SM90_STAGES=2 -DFLASHATTN_DEV_SM90_PINGPONG=0 -DFLASHATTN_DEV_SM90_CTAS=2"
for n in base x1 x2; do
  case $n in base) F=""; j=6;; x1) F="$X1"; j=5;; x2) F="$X2"; j=5;; esac
  (CMAKE_BUILD_PARALLEL_LEVEL=$j timeout 220 $PIP --target /tmp/pk-$n -Cbuild-dir=/tmp/bb-$n \
     "-Ccmake.define.CMAKE_CUDA_FLAGS=$F" . > /tmp/logs/pip-$n.log 2>&1) &
done
wait; t built
for n in base x1 x2; do [ -d /tmp/pk-$n/flashattn ] || { echo "package $n failed"; grep -E "error" /tmp/logs/pip-$n.log | head -5; }; done
[ -d /tmp/pk-base/flashattn ] || { tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }
(PYTHONPATH=/tmp/pk-base FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 110)" python3 -m pytest tests/python/test_cuda.py \
   tests/python/test_torch.py -q -p no:cacheprovider > /tmp/logs/py-base.log 2>&1
 echo "pytest cuda+torch (sm90) base: $(tail -1 /tmp/logs/py-base.log)"; grep -E "^FAILED|^ERROR" /tmp/logs/py-base.log | head -8) &
for n in x1 x2; do
  [ -d /tmp/pk-$n/flashattn ] || continue
  (PYTHONPATH=/tmp/pk-$n FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 110)" python3 -m pytest tests/python/test_cuda.py -q \
     -p no:cacheprovider > /tmp/logs/py-$n.log 2>&1
   echo "pytest cuda (sm90) $n: $(tail -1 /tmp/logs/py-$n.log)"; grep -E "^FAILED|^ERROR" /tmp/logs/py-$n.log | head -5) &
done
(PYTHONPATH=/tmp/pk-base FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 80)" compute-sanitizer --tool racecheck --print-limit 20 \
   python3 dev/san_cases.py --only bwd_d128_causal,bwd_d128_2tiles,bwd_d64_causal_2tiles,bwd_varlen_causal > /tmp/logs/san-racecheck.txt 2>&1
 echo "racecheck: rc $? $(grep -E 'RACECHECK SUMMARY' /tmp/logs/san-racecheck.txt | tail -1) | $(grep -E 'ALL OK|SOME FAILED' /tmp/logs/san-racecheck.txt)"
 grep -E "Race reported" /tmp/logs/san-racecheck.txt | sort | uniq -c | head -8
 PYTHONPATH=/tmp/pk-base FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 30)" compute-sanitizer --tool memcheck --print-limit 20 python3 dev/san_cases.py \
   --only bwd_d128_causal,bwd_d128_2tiles,bwd_d64_causal_2tiles,bwd_varlen_causal > /tmp/logs/san-memcheck.txt 2>&1
 echo "memcheck: rc $? $(grep -E 'ERROR SUMMARY' /tmp/logs/san-memcheck.txt | tail -1) | $(grep -E 'ALL OK|SOME FAILED' /tmp/logs/san-memcheck.txt)") &
wait; t "tests and sanitizers"
export PYTHONPATH=/tmp/pk-base
timeout "$(cap 50)" python3 dev/kernel_split.py --impls flashattn,sdpa_cudnn \
  --shapes 128:512,128:512:c,128:1024,128:1024:c,64:1024,64:1024:c,128:2048,64:16384:c,128:16384 \
  --out $OUT/split-bwd.json > /tmp/logs/split-bwd.txt 2>&1
t "split bwd rc $?"
timeout "$(cap 80)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
  --seqlens 512,1024,2048,4096,16384 --impls flashattn,sdpa_cudnn --repeats 20 --out $OUT/full.json > /tmp/logs/bench.log 2>&1
t "bench full rc $?"
for n in x1 x2 base2; do
  pk=/tmp/pk-${n%2}
  [ -d $pk/flashattn ] || continue
  PYTHONPATH=$pk timeout "$(cap 40)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
    --seqlens 512,1024,2048,16384 --impls flashattn,sdpa_cudnn --repeats 20 --no-backward --out $OUT/ctas-$n.json > /tmp/logs/bench-$n.log 2>&1
  t "bench $n rc $?"
done
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 - <<'PY'
import json, os
out = os.environ.get("OUT", "/tmp/flashattn-out")
try:
    d = json.load(open(out + "/split-bwd.json"))
    for r in d["results"]:
        ks = r["kernels"]
        side = ", ".join(f"{k['name'].split('<')[0].split('::')[-1][:22]} {k['us']:.1f}" for k in ks[1:])
        print(f"{r['impl'][:10]:10} d{r['d']} {r['n']:5}{'c' if r['causal'] else ' '} total {r['total_us']:7.1f} main {ks[0]['us']:7.1f} | {side}")
except Exception as e:
    print("split:", e)
def load(fn):
    try:
        return {(r['d'], r['n'], r['causal']): r for r in json.load(open(f"{out}/{fn}"))["rows"]}
    except Exception as e:
        print(fn, e); return {}
full, x1, x2, b2 = (load(f) for f in ("full.json", "ctas-x1.json", "ctas-x2.json", "ctas-base2.json"))
for key, r in full.items():
    f, c = r["flashattn"], r["sdpa_cudnn"]
    line = f"d{key[0]} {key[1]:5}{'c' if key[2] else ' '} fwd x{c['fwd_ms']/f['fwd_ms']:.3f} bwd x{c['bwd_ms']/f['bwd_ms']:.3f} ({f['bwd_tflops']:.0f} vs {c['bwd_tflops']:.0f})"
    for name, other in (("x1", x1), ("x2", x2), ("base2", b2)):
        if key in other and "fwd_ms" in other[key].get("flashattn", {}):
            o = other[key]
            line += f" | {name} fwd x{o['sdpa_cudnn']['fwd_ms']/o['flashattn']['fwd_ms']:.3f}"
    print(line)
PY
