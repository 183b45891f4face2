#!/usr/bin/env bash
# Per-SASS-instruction profile (warp stall samples, excessive sectors/wavefronts) of flashattn's
# main kernel and FA2's for one pass and shape, on the GPU machine: Nsight Compute's source page
# as CSV, gzipped, plus each kernel's stall-reason totals. Writes $OUT/ncu-src-PASS-SHAPE.csv.gz
# and prints the totals. Usage: dev/ncu_source.sh fwd|fwd8|bwd "B H N D[/DV] [causal]"
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
pass=${1:-bwd}
shape=${2:-"4 16 4096 128"}
tag=$pass-$(echo "$shape" | tr ' /' '__')
case $pass in
  fwd) kernels="regex:fwd_kernel" ;;
  fwd8) kernels="regex:fwd8_kernel" ;;  # the FP8 forward (profile_attn.py fwd8)
  bwd) kernels="regex:bwd_kernel|bwd_kv_kernel|bwd_dq_kernel|dq_dk_dv" ;;
esac
rep=/tmp/ncu-src-$tag
ncu --clock-control none --profile-from-start off -k "$kernels" --import-source no \
  --section WarpStateStats --section SourceCounters --section InstructionStats \
  -f -o "$rep" python3 dev/profile_attn.py "$pass" $shape >/dev/null 2>&1
ncu --import "$rep.ncu-rep" --page source --print-source sass --csv 2>/dev/null | gzip >"$OUT/ncu-src-$tag.csv.gz"
ncu --import "$rep.ncu-rep" --page raw --csv 2>/dev/null |
  python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
head, units, data = rows[0], rows[1], rows[2:]
name = head.index("Kernel Name")
for r in data:
    print(r[name][:90])
    stalls = sorted(((float(v.replace(",", "")), h) for h, v in zip(head, r)
                     if "issue_stalled" in h and h.endswith(".ratio") and v.strip() not in ("", "n/a")),
                    reverse=True)
    for v, h in stalls[:12]:
        print(f"  {v:8.3f}  {h}")
'
