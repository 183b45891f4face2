#!/usr/bin/env bash
# Nsight Compute sections for flashattn's forward kernel and FA2's (SDPA flash) on one shape, on
# the GPU machine, for side-by-side stall and instruction analysis. Writes $OUT/ncu-fwd-*.txt.
# Usage: dev/ncu_fwd.sh "B H N D [causal]"   (default "4 16 4096 128")
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
shape=${1:-"4 16 4096 128"}
tag=$(echo "$shape" | tr ' ' '_')
ncu --clock-control none --profile-from-start off --cache-control all \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
  --section InstructionStats \
  python3 dev/profile_fwd.py $shape >"$OUT/ncu-fwd-$tag.txt" 2>&1
grep -E "^  [a-zA-Z_:]+.*\(|Duration|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Stall|Executed Ipc A|Warp Cycles Per Issued|Theoretical Occupancy|Block Limit" \
  "$OUT/ncu-fwd-$tag.txt" | head -80
