#!/usr/bin/env bash
# Twelfth session, GPU call 2 (one H200, < 540 s), run from .carry/snap with .carry/fa4a beside it
# (kept in /tmp/fa4w for call 3, which installs FlashAttention-4 into this call's package):
#  1. the package (d64;128;192;256, bf16 and fp16, gtests) in /tmp/pk, /tmp/bb;
#  2. tests at once: the whole ctest under FLASHATTN_CUDA_PATH=sm90 (the eleventh session's call
#     ran 499 of 699 correctness cases), pytest cuda/torch/bias/block_sparse/sink under sm90,
#     racecheck + synccheck of the backward cases of dev/san_cases.py (the new stores shuffle);
#  3. dev/kernel_split.py of the backward (the dQ conversion and dK/dV stores changed), the same
#     shapes as call 1, then the bf16 full suite d64/d128 against cuDNN.
# Writes $OUT/{split-bwd,full}.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 530 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/fa4w
[ -d ../fa4a ] && cp ../fa4a/* /tmp/fa4w/ && t "fa4a kept: $(ls /tmp/fa4w | wc -l) files"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 250 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;192;256" \
  "-Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16;fp16" -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . > /tmp/logs/pip.log 2>&1
[ -d /tmp/pk/flashattn ] || { echo "build failed"; grep -E "error" /tmp/logs/pip.log | head; tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }
t "package built"
grep -h "spill" /tmp/logs/pip.log | grep -v " 0 bytes spill" | sort | uniq -c | head -5
timeout 120 cmake --build /tmp/bb -j 16 > /tmp/logs/gt.log 2>&1 || grep -E "error" /tmp/logs/gt.log | head -5
t "gtests built"
export PYTHONPATH=/tmp/pk
(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 230)" ctest --test-dir /tmp/bb -j 6 --timeout 200 > /tmp/logs/ct-sm90.log 2>&1
 echo "ctest sm90: $(grep -E 'tests passed|tests failed' /tmp/logs/ct-sm90.log)"
 grep -E "\(Failed\)|Timeout|SEGFAULT|Exception" /tmp/logs/ct-sm90.log | head -8) &
(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 230)" python3 -m pytest tests/python/test_cuda.py tests/python/test_torch.py \
   tests/python/test_bias.py tests/python/test_block_sparse.py tests/python/test_sink.py -q -p no:cacheprovider > /tmp/logs/py-sm90.log 2>&1
 echo "pytest cuda+torch+bias+block_sparse+sink (sm90): $(tail -1 /tmp/logs/py-sm90.log)"; grep -E "^FAILED|^ERROR" /tmp/logs/py-sm90.log | head -10) &
(FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 200)" compute-sanitizer --tool racecheck --print-limit 20 \
   python3 dev/san_cases.py --only bwd_d128_causal,bwd_d128_2tiles,bwd_d64_causal_2tiles,bwd_varlen_causal,bwd_192_128_causal > /tmp/logs/san-racecheck.txt 2>&1
 echo "racecheck: rc $? $(grep -E 'RACECHECK SUMMARY' /tmp/logs/san-racecheck.txt | tail -1) | $(grep -E 'ALL OK|SOME FAILED' /tmp/logs/san-racecheck.txt)"
 grep -E "Race reported" /tmp/logs/san-racecheck.txt | sort | uniq -c | head -8
 FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 120)" compute-sanitizer --tool memcheck --print-limit 20 python3 dev/san_cases.py \
   --only bwd_d128_causal,bwd_d128_2tiles,bwd_d64_causal_2tiles,bwd_varlen_causal,bwd_192_128_causal > /tmp/logs/san-memcheck.txt 2>&1
 echo "memcheck: rc $? $(grep -E 'ERROR SUMMARY' /tmp/logs/san-memcheck.txt | tail -1) | $(grep -E 'ALL OK|SOME FAILED' /tmp/logs/san-memcheck.txt)") &
wait; t "tests and sanitizers"
timeout "$(cap 60)" python3 dev/kernel_split.py --impls flashattn,sdpa_cudnn \
  --shapes 128:512,128:512:c,128:1024,128:1024:c,64:1024,64:1024:c,128:2048,64:16384:c,128:16384 \
  --out $OUT/split-bwd.json > /tmp/logs/split-bwd.txt 2>&1
t "split bwd rc $?"
timeout "$(cap 90)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
  --seqlens 512,1024,2048,4096,16384 --impls flashattn,sdpa_cudnn --repeats 20 --out $OUT/full.json > /tmp/logs/bench.log 2>&1
t "bench rc $?"
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
try:
    d = json.load(open(out + "/full.json"))
    for r in d["rows"]:
        f, c = r["flashattn"], r["sdpa_cudnn"]
        print(f"{r['dtype']} d{r['d']} {r['n']:5}{'c' if r['causal'] else ' '} fwd {c['fwd_ms']/f['fwd_ms']:.3f} bwd {c['bwd_ms']/f['bwd_ms']:.3f} ({f['bwd_tflops']:.0f} vs {c['bwd_tflops']:.0f})")
except Exception as e:
    print("bench:", e)
PY
