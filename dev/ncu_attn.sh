#!/usr/bin/env bash
# Nsight Compute sections for flashattn's kernels and its peers' (dev/profile_attn.py: PEERS,
# default SDPA flash = FA2; sdpa_cudnn, fa4 with FA4's wheels on PYTHONPATH as gpu-check.sh
# FA4_WHEELS sets it) on one shape and pass, on the GPU machine, for side-by-side stall and
# instruction analysis. Writes $OUT/ncu-PASS-*.txt.
# Usage: [PEERS=fa4] dev/ncu_attn.sh fwd|bwd "B H N D[/DV] [causal]"   (default shape "4 16 4096 128")
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
pass=${1:-fwd}
shape=${2:-"4 16 4096 128"}
tag=$(echo "$shape" | tr ' /' '__')
ncu --clock-control none --profile-from-start off --cache-control all \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
  --section InstructionStats --section SourceCounters \
  python3 dev/profile_attn.py "$pass" $shape >"$OUT/ncu-$pass-$tag.txt" 2>&1
grep -E "^  [a-zA-Z_:]+.*\(|Duration|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Stall|Executed Ipc A|Warp Cycles Per Issued|Theoretical Occupancy|Block Limit|Bank Conflicts|Shared Memory|L1/TEX Hit|Executed Instructions  " \
  "$OUT/ncu-$pass-$tag.txt" | head -120
