#!/usr/bin/env bash
# Session script (s29 call 3, deleted after its run). Two d128 bf16 packages:
#  - log: main + -DFLASHATTN_DEV_LOG_SPLITS (every sm80 forward launch prints its split count);
#    bench.py's decode suite with flashattn, kvcache, sdpa_math (s28's slow list), split counts
#    per launch kept in order (the decode-after-sdpa_math question, NOTES item 14);
#  - c3: the FP8 d128 tile with three consumer warpgroups and 64-key blocks (192 x 64, 160
#    registers, ptxas 0 spills); test_fp8.py, then FP8 d128 timing against the log package's
#    (shipped 128 x 128 tile), alternated twice.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
T0=$(date +%s)
declare -A FL=([log]="-DFLASHATTN_DEV_LOG_SPLITS"
  [c3]="-DFLASHATTN_DEV_FP8_HDIM=128 -DFLASHATTN_DEV_FP8_CONSUMERS=3 -DFLASHATTN_DEV_FP8_BN=64")
for n in log c3; do
  [ -d /tmp/ab-$n/flashattn ] && continue
  ( CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$n \
      -Cbuild-dir=build-ab-$n -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128" \
      -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${FL[$n]}" . \
      >"$OUT/r/pip-$n.log" 2>&1 || echo "BUILD FAILED $n" ) &
done
wait
echo "built in $(( $(date +%s) - T0 )) s"
PYTHONPATH=/tmp/ab-c3 timeout 200 python3 -m pytest tests/python/test_fp8.py -q -p no:cacheprovider >"$OUT/r/test-c3.log" 2>&1
echo "test c3: $(tail -1 "$OUT/r/test-c3.log")"
for round in 1 2; do
  for n in log c3; do
    PYTHONPATH=/tmp/ab-$n timeout 100 python3 bench/bench.py --suite full --dtypes bf16 --head-dims 128 \
      --seqlens 4096,16384 --impls flashattn_fp8 --no-backward --repeats 20 --out "$OUT/r/ab-$n-$round.json" \
      >"$OUT/r/bench-$n-$round.log" 2>&1 || echo "bench $n $round failed"
  done
done
echo "fp8 benched at $(( $(date +%s) - T0 )) s"
python3 - "$OUT/r" <<'PY'
import json, glob, sys
t = {}
for f in sorted(glob.glob(sys.argv[1] + "/ab-*.json")):
    tag = f.split("/ab-")[1][:-5]
    for r in json.load(open(f))["rows"]:
        t.setdefault((r["d"], r["n"], r["causal"]), {})[tag] = r["flashattn_fp8"]["fwd_tflops"]
for k in sorted(t):
    print(k, " ".join(f"{tag}={v:.0f}" for tag, v in sorted(t[k].items())))
PY
PYTHONPATH=/tmp/ab-log timeout $(( 560 - ($(date +%s) - T0) )) python3 bench/bench.py --suite decode \
  --impls flashattn,kvcache,sdpa_math --repeats 10 --out "$OUT/r/decode-log.json" >"$OUT/r/decode.out" 2>"$OUT/r/decode.err"
echo "decode rc=$? at $(( $(date +%s) - T0 )) s"
grep "^decode" "$OUT/r/decode.out"
grep "flashattn splits" "$OUT/r/decode.err" | uniq -c > "$OUT/r/decode-splits.txt"; wc -l < "$OUT/r/decode-splits.txt"
tar czf "$OUT/s29c3.tgz" -C "$OUT" r && rm -rf "$OUT/r"
