#!/usr/bin/env bash
# Times forward tile shapes for one head dim: dev/tile_sweep.sh D "BM BN WARPS" ["BM BN WARPS" ...]
set -euo pipefail
d=$1; shift
for t in "$@"; do
  set -- $t
  out=/tmp/sweep-$d-$1-$2-$3
  DEV_FLAGS="-DFLASHATTN_DEV_FWD_BM=$1 -DFLASHATTN_DEV_FWD_BN=$2 -DFLASHATTN_DEV_FWD_WARPS=$3" \
    "$(dirname "$0")/build.sh" "$out" "$d" >"$out.log" 2>&1 || { tail -5 "$out.log"; continue; }
  echo "-- tile $t (d$d): $(grep -c spill "$out.log" || true) spill warnings"
  "$out/fwd_check" --bench --dims="$d" | grep -v "^ok" || true
done
