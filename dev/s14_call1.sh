#!/usr/bin/env bash
# Fourteenth session (s14), GPU call 1 (one H200, < 560 s):
#  1. packages: /tmp/pk (main: d64;128;256 bf16, the deterministic dQ kernel's 16-byte stores),
#     /tmp/ab-bn64s3 and /tmp/ab-bn64s2 (d64: the masked short tile at 64 keys, 3 or 2 stages);
#  2. pytest test_cuda under sm90 on each (the variants at d64 only);
#  3. A/B: d64 forward 512/1k/2k, causal and not, against cuDNN, base / bn64s3 / bn64s2 / base;
#  4. backward: flashattn, flashattn_det (deterministic=True), cuDNN at d64/d128/d256 1k/4k/16k;
#  5. ncu sections of the d256 forward at 512 (unmasked) and 1k causal, ours against cuDNN.
# Writes $OUT/ab-*.json, $OUT/det.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 550 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/ncu
build() {  # name dims jobs flags
  CMAKE_BUILD_PARALLEL_LEVEL=$3 timeout 240 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/$1 \
    -Cbuild-dir=/tmp/b-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$2" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=$4" . > /tmp/logs/pip-$1.log 2>&1
}
build pk "64;128;256" 10 "" &
build ab-bn64s3 64 3 "-DFLASHATTN_DEV_SM90_SHORT_BN=64 -DFLASHATTN_DEV_SM90_SHORT_STAGES=3" &
build ab-bn64s2 64 3 "-DFLASHATTN_DEV_SM90_SHORT_BN=64" &
wait
for p in pk ab-bn64s3 ab-bn64s2; do [ -d /tmp/$p/flashattn ] || { echo "build $p failed"; grep -E "error" /tmp/logs/pip-$p.log | head; }; done
[ -d /tmp/pk/flashattn ] || { tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }
t built
pyt() {  # package log [args]
  local p=$1 log=$2; shift 2
  PYTHONPATH=/tmp/$p FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 150)" python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider "$@" \
    > /tmp/logs/$log.log 2>&1
  echo "test_cuda $p (sm90): $(tail -1 /tmp/logs/$log.log)"; grep -E "^FAILED|^ERROR" /tmp/logs/$log.log | head -5
}
pyt pk py-pk & pyt ab-bn64s3 py-bn64s3 & pyt ab-bn64s2 py-bn64s2 & wait
t tested
ab() {  # name package
  PYTHONPATH=/tmp/$2 timeout "$(cap 60)" python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 \
    --head-dims 64 --seqlens 512,1024,2048 --repeats 20 --no-backward --out $OUT/ab-$1.json > /tmp/logs/ab-$1.log 2>&1
  t "ab $1 rc $?"
}
ab base pk; ab bn64s3 ab-bn64s3; ab bn64s2 ab-bn64s2; ab base2 pk
PYTHONPATH=/tmp/pk timeout "$(cap 150)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128,256 \
  --seqlens 1024,4096,16384 --impls flashattn,flashattn_det,sdpa_cudnn --repeats 10 --out $OUT/det.json > /tmp/logs/det.log 2>&1
t "det rc $?"
export PYTHONPATH=/tmp/pk
for shape in "32 8 512 256" "16 8 1024 256 causal"; do
  PEERS=sdpa_cudnn OUT=/tmp/ncu timeout "$(cap 70)" bash dev/ncu_attn.sh fwd "$shape" > /tmp/logs/ncu-$(echo $shape | tr ' ' _).txt 2>&1
  t "ncu $shape rc $?"
done
cp /tmp/ncu/*.txt /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 - <<'PY'
import json, os
out = os.environ.get("OUT", "/tmp/flashattn-out")
def load(n):
    try: return json.load(open(f"{out}/{n}.json"))["rows"]
    except Exception as e: print(n, "missing", e); return []
base = load("ab-base")
for name in ("bn64s3", "bn64s2", "base2"):
    for r, b in zip(load("ab-" + name), base):
        a, c = r["flashattn"], r["sdpa_cudnn"]
        print(f"{name:7s} d{r['d']} {r['n']:5d} {'C' if r['causal'] else ' '} fwd {a['fwd_tflops']:6.1f} ({a['fwd_tflops']/b['flashattn']['fwd_tflops']-1:+.1%} vs base) cuDNN {c['fwd_tflops']:6.1f} ratio {a['fwd_tflops']/c['fwd_tflops']:.3f} (base {b['flashattn']['fwd_tflops']/b['sdpa_cudnn']['fwd_tflops']:.3f})")
for r in load("det"):
    a, dd, c = r["flashattn"], r.get("flashattn_det", {}), r["sdpa_cudnn"]
    print(f"det d{r['d']} {r['n']:5d} {'C' if r['causal'] else ' '} bwd ours {a['bwd_tflops']:6.1f} det {dd.get('bwd_tflops', 0):6.1f} ({dd.get('bwd_tflops', 0)/a['bwd_tflops']-1:+.1%}) cuDNN {c['bwd_tflops']:6.1f} ratio {a['bwd_tflops']/c['bwd_tflops']:.3f} det/cuDNN {dd.get('bwd_tflops', 0)/c['bwd_tflops']:.3f} | fwd {a['fwd_tflops']/c['fwd_tflops']:.3f}")
PY
for f in /tmp/logs/ncu-*_*.txt; do echo "== $f"; cut -c1-160 $f | grep -E "fwd_kernel|cudnn|Duration|Registers Per|Issued Warp|Executed Ipc A|Executed Instructions  |Grid Size|Block Size|Compute \(SM\) Th|L2 Cache Th|DRAM Th|Memory Throughput|Waves" | head -40; done
