#!/usr/bin/env bash
# Session script (s29 call 2, deleted after its run): the FP8 forward's softmax A/B.
# Packages (d64;128, bf16, sm_90): base; tree (row max as a tree, FP8 and bf16 kernels);
# tree + every 4th / 3rd / 2nd score chunk's exponentials on the FMA units (FP8 only).
# test_fp8.py's CUDA cases on each FMA-exponential package, then timing rounds alternating
# the packages (bf16 flashattn and cuDNN in base and tree, FP8 everywhere).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
T0=$(date +%s)
declare -A FL=([base]="" [tree]="-DFLASHATTN_DEV_FP8_TREE_MAX -DFLASHATTN_DEV_SM90_TREE_MAX"
  [poly4]="-DFLASHATTN_DEV_FP8_TREE_MAX -DFLASHATTN_DEV_SM90_TREE_MAX -DFLASHATTN_DEV_FP8_POLY_PERIOD=4"
  [poly3]="-DFLASHATTN_DEV_FP8_TREE_MAX -DFLASHATTN_DEV_SM90_TREE_MAX -DFLASHATTN_DEV_FP8_POLY_PERIOD=3"
  [poly2]="-DFLASHATTN_DEV_FP8_TREE_MAX -DFLASHATTN_DEV_SM90_TREE_MAX -DFLASHATTN_DEV_FP8_POLY_PERIOD=2")
NAMES="base tree poly4 poly3 poly2"
for n in $NAMES; do
  [ -d /tmp/ab-$n/flashattn ] && continue
  ( CMAKE_BUILD_PARALLEL_LEVEL=4 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$n \
      -Cbuild-dir=build-ab-$n -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
      -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 ${FL[$n]:+"-Ccmake.define.CMAKE_CUDA_FLAGS=${FL[$n]}"} . \
      >"$OUT/r/pip-$n.log" 2>&1 || echo "BUILD FAILED $n" ) &
done
wait
echo "built in $(( $(date +%s) - T0 )) s"
for n in poly4 poly3 poly2; do
  PYTHONPATH=/tmp/ab-$n timeout 200 python3 -m pytest tests/python/test_fp8.py -q -p no:cacheprovider -x \
    >"$OUT/r/test-$n.log" 2>&1 &
done
wait
for n in poly4 poly3 poly2; do echo "test $n: $(tail -1 "$OUT/r/test-$n.log")"; done
echo "tested at $(( $(date +%s) - T0 )) s"
for round in 1 2; do
  for n in $NAMES; do
    [ $(( $(date +%s) - T0 )) -gt 520 ] && break 2
    impls=flashattn_fp8; case $n in base|tree) impls=flashattn,flashattn_fp8,sdpa_cudnn;; esac
    PYTHONPATH=/tmp/ab-$n timeout 120 python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
      --seqlens 4096,16384 --impls $impls --no-backward --repeats 20 --out "$OUT/r/ab-$n-$round.json" >"$OUT/r/bench-$n-$round.log" 2>&1 \
      || echo "bench $n $round failed"
  done
done
echo "benched at $(( $(date +%s) - T0 )) s"
python3 - "$OUT/r" <<'PY'
import json, glob, sys, collections
rows = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/ab-*.json")):
    tag = f.split("/ab-")[1][:-5]
    for r in json.load(open(f))["rows"]:
        key = (r.get("d"), r.get("n"), r.get("causal"))
        for impl, v in r.items():
            if isinstance(v, dict) and "fwd_tflops" in v:
                rows[key][(impl, tag)] = v["fwd_tflops"]
for key in sorted(rows, key=str):
    print(key, " ".join(f"{i[:6]}/{t}={v:.0f}" for (i, t), v in sorted(rows[key].items())))
PY
tar czf "$OUT/s29c2.tgz" -C "$OUT" r && rm -rf "$OUT/r"
