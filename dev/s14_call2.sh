#!/usr/bin/env bash
# Fourteenth session (s14), GPU call 2 (one H200, < 580 s):
#  1. packages (bf16): /tmp/pk main at d64;128;192;256; /tmp/ab-ch (O stored in 16-byte chunks at
#     d192/d256 and FP8 d64/d256: FLASHATTN_DEV_SM90_O_CHUNKS_ALL) at d64;256; /tmp/ab-bn64 (d256
#     forward tile 128 x 64) and /tmp/ab-chbn64 (both) at d256;
#  2. pytest test_cuda under sm90 on each; test_fp8 on ab-ch;
#  3. A/B: d256 forward 512-16k, causal and not, against cuDNN: base / ch / bn64 / chbn64 / base;
#     FP8 forward d64/d256 4k/16k, base against ch;
#  4. backward: flashattn, flashattn_det, cuDNN at d64/d128/d256 1k/4k/16k (pk).
# Writes $OUT/ab-*.json, $OUT/det.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 570 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
build() {  # name dims jobs flags
  CMAKE_BUILD_PARALLEL_LEVEL=$3 timeout 260 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/$1 \
    -Cbuild-dir=/tmp/b-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$2" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=$4" . > /tmp/logs/pip-$1.log 2>&1
}
BN64="-DFLASHATTN_DEV_SM90_HDIM=256 -DFLASHATTN_DEV_SM90_CONSUMERS=2 -DFLASHATTN_DEV_SM90_BN=64 -DFLASHATTN_DEV_SM90_STAGES=2 -DFLASHATTN_DEV_SM90_PINGPONG=1"
build pk "64;128;192;256" 8 "" &
build ab-ch "64;256" 3 "-DFLASHATTN_DEV_SM90_O_CHUNKS_ALL" &
build ab-bn64 256 3 "$BN64" &
build ab-chbn64 256 3 "$BN64 -DFLASHATTN_DEV_SM90_O_CHUNKS_ALL" &
wait
for p in pk ab-ch ab-bn64 ab-chbn64; do [ -d /tmp/$p/flashattn ] || { echo "build $p failed"; grep -E "error" /tmp/logs/pip-$p.log | head; }; done
[ -d /tmp/pk/flashattn ] || { tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }
t built
pyt() {  # package log files...
  local p=$1 log=$2; shift 2
  PYTHONPATH=/tmp/$p FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 170)" python3 -m pytest "$@" -q -p no:cacheprovider \
    > /tmp/logs/$log.log 2>&1
  echo "$log: $(tail -1 /tmp/logs/$log.log)"; grep -E "^FAILED|^ERROR" /tmp/logs/$log.log | head -5
}
pyt pk py-pk tests/python/test_cuda.py tests/python/test_torch.py & pyt ab-ch py-ch tests/python/test_cuda.py tests/python/test_fp8.py &
pyt ab-bn64 py-bn64 tests/python/test_cuda.py & pyt ab-chbn64 py-chbn64 tests/python/test_cuda.py & wait
t tested
ab() {  # name package
  PYTHONPATH=/tmp/$2 timeout "$(cap 60)" python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 \
    --head-dims 256 --seqlens 512,1024,2048,4096,16384 --repeats 20 --no-backward --out $OUT/ab-$1.json > /tmp/logs/ab-$1.log 2>&1
  t "ab $1 rc $?"
}
ab base pk; ab ch ab-ch; ab bn64 ab-bn64; ab chbn64 ab-chbn64; ab base2 pk
for p in pk ab-ch; do
  PYTHONPATH=/tmp/$p timeout "$(cap 60)" python3 bench/bench.py --suite full --impls flashattn_fp8 --dtypes bf16 \
    --head-dims 64,256 --seqlens 4096,16384 --repeats 20 --no-backward --out /tmp/logs/fp8-$p.json > /tmp/logs/fp8-$p.log 2>&1
  t "fp8 $p rc $?"
done
PYTHONPATH=/tmp/pk timeout "$(cap 160)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128,256 \
  --seqlens 1024,4096,16384 --impls flashattn,flashattn_det,sdpa_cudnn --repeats 10 --out $OUT/det.json > /tmp/logs/det.log 2>&1
t "det rc $?"
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 - <<'PY'
import json, os
out = os.environ.get("OUT", "/tmp/flashattn-out")
def load(n):
    try: return json.load(open(n if n.startswith("/") else f"{out}/{n}.json"))["rows"]
    except Exception as e: print(n, "missing", e); return []
base = load("ab-base")
for name in ("ch", "bn64", "chbn64", "base2"):
    for r, b in zip(load("ab-" + name), base):
        a, c = r["flashattn"], r["sdpa_cudnn"]
        print(f"{name:6s} d{r['d']} {r['n']:5d} {'C' if r['causal'] else ' '} fwd {a['fwd_tflops']:6.1f} ({a['fwd_tflops']/b['flashattn']['fwd_tflops']-1:+.1%} vs base) cuDNN {c['fwd_tflops']:6.1f} ratio {a['fwd_tflops']/c['fwd_tflops']:.3f} (base {b['flashattn']['fwd_tflops']/b['sdpa_cudnn']['fwd_tflops']:.3f})")
for r, b in zip(load("/tmp/logs/fp8-ab-ch.json"), load("/tmp/logs/fp8-pk.json")):
    a, bb = r.get("flashattn_fp8", {}), b.get("flashattn_fp8", {})
    if "fwd_tflops" in a and "fwd_tflops" in bb:
        print(f"fp8 d{r['d']} {r['n']:5d} {'C' if r['causal'] else ' '} ch {a['fwd_tflops']:6.1f} base {bb['fwd_tflops']:6.1f} ({a['fwd_tflops']/bb['fwd_tflops']-1:+.1%})")
for r in load("det"):
    a, dd, c = r["flashattn"], r.get("flashattn_det", {}), r["sdpa_cudnn"]
    print(f"det d{r['d']} {r['n']:5d} {'C' if r['causal'] else ' '} bwd ours {a['bwd_tflops']:6.1f} det {dd.get('bwd_tflops', 0):6.1f} ({dd.get('bwd_tflops', 0)/a['bwd_tflops']-1:+.1%}) cuDNN {c['bwd_tflops']:6.1f} ratio {a['bwd_tflops']/c['bwd_tflops']:.3f} det/cuDNN {dd.get('bwd_tflops', 0)/c['bwd_tflops']:.3f} | fwd {a['fwd_tflops']/c['fwd_tflops']:.3f}")
PY
