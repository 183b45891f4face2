#!/usr/bin/env bash
# Fourteenth session (s14), GPU call 3 (one H200, < 590 s): the session's defaults (O in 16-byte
# chunks at every head dim, d256's masked short-rows tile, the deterministic dQ kernel's stores).
#  1. /tmp/pk: d64;128;192;256, bf16 and fp16;
#  2. pytest test_cuda, test_torch, test_fp8 under sm90 and test_cuda under auto; beside them
#     compute-sanitizer racecheck, synccheck, memcheck of fwd_d256_short_causal and
#     bwd_d128_det_causal (dev/san_cases.py, sm90);
#  3. the full suite against cuDNN, bf16 then fp16 (as far as time allows).
# Writes $OUT/full-bf16.json, $OUT/full-fp16.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 580 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 240 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/b-pk -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;192;256" \
  "-Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16;fp16" . > /tmp/logs/pip.log 2>&1
[ -d /tmp/pk/flashattn ] || { echo "build failed"; grep -E "error" /tmp/logs/pip.log | head; tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }
t built
export PYTHONPATH=/tmp/pk
pyt() {  # log path files...
  local log=$1 path=$2; shift 2
  FLASHATTN_CUDA_PATH=$path timeout "$(cap 200)" python3 -m pytest "$@" -q -p no:cacheprovider > /tmp/logs/$log.log 2>&1
  echo "$log: $(tail -1 /tmp/logs/$log.log)"; grep -E "^FAILED|^ERROR" /tmp/logs/$log.log | head -5
}
san() {  # tool
  FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 150)" compute-sanitizer --tool $1 --print-limit 20 python3 dev/san_cases.py \
    --only fwd_d256_short_causal,bwd_d128_det_causal > /tmp/logs/san-$1.txt 2>&1
  echo "$1 rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/logs/san-$1.txt | tail -1) $(grep -cE 'ok$' /tmp/logs/san-$1.txt) ok, $(grep -c FAIL /tmp/logs/san-$1.txt) FAIL"
}
pyt py-sm90 sm90 tests/python/test_cuda.py tests/python/test_torch.py tests/python/test_fp8.py &
pyt py-auto auto tests/python/test_cuda.py &
(san racecheck; san synccheck; san memcheck) &
wait
t tested
timeout "$(cap 230)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128,256 --impls flashattn,sdpa_cudnn \
  --repeats 20 --out $OUT/full-bf16.json > /tmp/logs/full-bf16.log 2>&1
t "bf16 suite rc $?"
timeout "$(cap 230)" python3 bench/bench.py --suite full --dtypes fp16 --head-dims 64,128,256 --impls flashattn,sdpa_cudnn \
  --repeats 20 --out $OUT/full-fp16.json > /tmp/logs/full-fp16.log 2>&1
t "fp16 suite rc $?"
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 - <<'PY'
import json, os
out = os.environ.get("OUT", "/tmp/flashattn-out")
for dt in ("bf16", "fp16"):
    try: rows = json.load(open(f"{out}/full-{dt}.json"))["rows"]
    except Exception as e: print(dt, "missing", e); continue
    for r in rows:
        a, c = r["flashattn"], r["sdpa_cudnn"]
        if "fwd_tflops" not in a or "fwd_tflops" not in c: continue
        print(f"{dt} d{r['d']:3d} {r['n']:5d} {'C' if r['causal'] else ' '} fwd {a['fwd_tflops']:6.1f}/{c['fwd_tflops']:6.1f} {a['fwd_tflops']/c['fwd_tflops']:.3f}"
              f" bwd {a.get('bwd_tflops', 0):6.1f}/{c.get('bwd_tflops', 1):6.1f} {a.get('bwd_tflops', 0)/c.get('bwd_tflops', 1):.3f}")
PY
