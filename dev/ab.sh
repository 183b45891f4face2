#!/usr/bin/env bash
# A/B of kernel variants in one GPU session: builds the Python package once per variant (trimmed
# to bf16 and the given head dims, each into its own --target folder, in parallel), runs
# tests/python/test_cuda.py on every variant but "base", then bench.py (flashattn vs SDPA flash, same
# process) on each. Variants are "name=CUDA flags" ("" = the default code). Writes
# $OUT/ab-NAME.json (one per variant: keep under the device tool's 8 returned files).
# Usage: dev/ab.sh "256" "1024,4096" "t64=-DFLASHATTN_DEV_FWD_BM=64 -DFLASHATTN_DEV_FWD_BN=64 -DFLASHATTN_DEV_FWD_WARPS=4" "base="
# (a variant lives in the kernels under a dev macro; bench.py times forward and backward of
# each; dev/NOTES.md records results and dev/results/ keeps their JSON).
# BENCH_ARGS adds bench.py flags, e.g. BENCH_ARGS="--softcap 30" to time the modifier kernels
# (FA2 has no softcap and skips those rows, so they show ours only). IMPLS replaces the peers
# (default flashattn,sdpa_flash); TEST_ARGS adds pytest flags (e.g. -k long); SUITE=decode times
# the decode suite instead of issue3 (then the seqlens argument is unused).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
dims=$1 seqlens=$2; shift 2
jobs=$(( $(nproc) / $# ))
names=()
for v in "$@"; do
  name=${v%%=*} flags=${v#*=}
  names+=("$name")
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$name \
    -Cbuild-dir=build-ab-$name -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=${dims//,/;}" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
    "-Ccmake.define.CMAKE_CUDA_FLAGS=$flags" . >"/tmp/ab-pip-$name.log" 2>&1 &
done
start=$(date +%s); wait; echo "builds: $(( $(date +%s) - start )) s"
for name in "${names[@]}"; do [ -d /tmp/ab-$name/flashattn ] || { tail -20 /tmp/ab-pip-$name.log; exit 1; }; done
# Every variant but one named "base" (the current default, tested by gpu-check) is checked
# against the float64 reference before it is timed.
# TEST_ARGS is split as the shell would split it (quotes kept: -k "backward or grad" is two
# arguments); unquoted expansion had passed '"backward' 'or' 'grad"' and pytest ran nothing.
eval "test_args=(${TEST_ARGS:-})"
for name in "${names[@]}"; do
  [ "$name" = base ] && continue
  echo "test_cuda $name: $(PYTHONPATH=/tmp/ab-$name python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider "${test_args[@]}" 2>&1 | tail -1)"
done
for name in "${names[@]}"; do
  echo "== $name"
  PYTHONPATH=/tmp/ab-$name python3 bench/bench.py --suite "${SUITE:-issue3}" --impls "${IMPLS:-flashattn,sdpa_flash}" --dtypes bf16 \
    --head-dims "$dims" --seqlens "$seqlens" --repeats 20 ${BENCH_ARGS:-} --out "$OUT/ab-$name.json" 2>&1 |
    grep -E "^(bf16|fp16) |^decode|error"
done
