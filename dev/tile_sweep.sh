#!/usr/bin/env bash
# Times forward tile shapes for one head dim: dev/tile_sweep.sh D "BM BN WARPS" ["BM BN WARPS" ...]
# FWD_CHECK_ARGS replaces fwd_check's timing flags (default --bench); e.g. decode tiles:
#   FWD_CHECK_ARGS=--decode dev/tile_sweep.sh 128 "128 64 4" "16 64 1" "32 64 2"
# (the override applies to every forward kernel; fwd_check still checks correctness first).
set -euo pipefail
d=$1; shift
for t in "$@"; do
  set -- $t
  out=/tmp/sweep-$d-$1-$2-$3
  DEV_FLAGS="-DFLASHATTN_DEV_FWD_BM=$1 -DFLASHATTN_DEV_FWD_BN=$2 -DFLASHATTN_DEV_FWD_WARPS=$3" \
    "$(dirname "$0")/build.sh" "$out" "$d" >"$out.log" 2>&1 || { tail -5 "$out.log"; continue; }
  echo "-- tile $t (d$d): $(grep -c spill "$out.log" || true) spill warnings"
  "$out/fwd_check" ${FWD_CHECK_ARGS:---bench} --dims="$d" | grep -v "^ok" || true
done
