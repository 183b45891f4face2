#!/usr/bin/env bash
# Session script (s29 call 6, deleted after its run): why 192 keys per block lost at FP8 d128 (s9,
# s18). Packages (d128 bf16): shipped 128 x 128 and -DFLASHATTN_DEV_FP8_BN=192 (240 / 24
# registers, fwd8_narrow_producer). FP8 timing of both (alternated twice), then ncu (full set,
# clocks not fixed) of each FP8 kernel at 1 x 16 x 16k with the source page.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
T0=$(date +%s)
declare -A FL=([b128]="-DFLASHATTN_DEV_FP8_HDIM=128" [b192]="-DFLASHATTN_DEV_FP8_HDIM=128 -DFLASHATTN_DEV_FP8_BN=192")
for n in b128 b192; do
  [ -d /tmp/ab-$n/flashattn ] && continue
  ( CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$n \
      -Cbuild-dir=build-ab-$n -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128" \
      -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=${FL[$n]}" . \
      >"$OUT/r/pip-$n.log" 2>&1 || echo "BUILD FAILED $n" ) &
done
wait
echo "built in $(( $(date +%s) - T0 )) s"
for round in 1 2; do
  for n in b128 b192; do
    PYTHONPATH=/tmp/ab-$n timeout 100 python3 bench/bench.py --suite full --dtypes bf16 --head-dims 128 \
      --seqlens 4096,16384 --impls flashattn_fp8 --no-backward --repeats 20 --out "$OUT/r/ab-$n-$round.json" \
      >"$OUT/r/bench-$n-$round.log" 2>&1 || echo "bench $n $round failed"
  done
done
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
echo "benched at $(( $(date +%s) - T0 )) s"
for n in b128 b192; do
  PYTHONPATH=/tmp/ab-$n timeout 150 ncu --clock-control none --profile-from-start off -k "regex:fwd8_kernel" --set full \
    --import-source no -f -o /tmp/ncu-$n python3 dev/profile_attn.py fwd8 1 16 16384 128 >"$OUT/r/ncu-$n.log" 2>&1
  ncu --import /tmp/ncu-$n.ncu-rep --page details 2>/dev/null >"$OUT/r/ncu-details-$n.txt"
  ncu --import /tmp/ncu-$n.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip >"$OUT/r/ncu-src-$n.csv.gz"
  grep -E "Duration|SM Frequency" "$OUT/r/ncu-details-$n.txt" | head -2
done
echo "profiled at $(( $(date +%s) - T0 )) s"
tar czf "$OUT/s29c6.tgz" -C "$OUT" r && rm -rf "$OUT/r"
