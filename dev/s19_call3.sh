#!/usr/bin/env bash
# Session script (s19 call 3, deleted after its run): the bias backward's plain pass (no softcap /
# ALiBi: exponentials before the dP wait): test_bias.py (auto, and its sm90 bias cases under sm90),
# memcheck / racecheck of the bias san cases, dev/bias_probe.py with the variants (no bias, ALiBi
# at zero slopes = the kMods pass, sm80) at d128 and d64, and ncu's source page of the bias kernel.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >"$OUT/pip.log" 2>&1 || { tail -30 "$OUT/pip.log"; exit 1; }
echo "$(el) built"; grep -h "spill" "$OUT/pip.log" | sort | uniq -c | head -5
cmake --build build-gpu/python -j 16 --target flashattn_test_bias flashattn_test_sparse >"$OUT/gtest-build.log" 2>&1 \
  || { tail -30 "$OUT/gtest-build.log"; exit 1; }
echo "$(el) gtests built"
gt() { FLASHATTN_CUDA_PATH=sm90 build-gpu/python/tests/cpp/$1 >"$OUT/gt-$1.log" 2>&1
       echo "$(el) $1 (sm90): $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/gt-$1.log" | tr '\n' ' ')"; grep -E '^\[  FAILED  \] [A-Z]' "$OUT/gt-$1.log" | head -6; }
run() { local path=$1 name=$2; shift 2
  ( [ "$path" = auto ] || export FLASHATTN_CUDA_PATH=$path
    python3 -m pytest "$@" -q -rs -p no:cacheprovider >"$OUT/t-$name.log" 2>&1
    echo "$(el) $name: $(tail -1 "$OUT/t-$name.log")"; grep -E "^(FAILED|ERROR)" "$OUT/t-$name.log" | head -8 ); }
run auto bias-auto tests/python/test_bias.py &
run sm90 bias-sm90 tests/python/test_bias.py -k "sm90" &
gt flashattn_test_bias & gt flashattn_test_sparse &
wait
san() { FLASHATTN_CUDA_PATH=sm90 timeout 200 compute-sanitizer --tool $1 --error-exitcode 9 python3 dev/san_cases.py \
          --only bwd_bias_d128_causal,bwd_bias_d64_keypad >"$OUT/san-$1.log" 2>&1
        echo "$(el) $1 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$1.log" | tail -1) $(grep -cE ' ok$' "$OUT/san-$1.log") ok, $(grep -c FAIL "$OUT/san-$1.log") FAIL"; }
san memcheck & san racecheck & wait
python3 dev/bias_probe.py --seqlens 2048,8192 --sm80 --variants --out "$OUT/bias-probe-d128.json" 2>&1 | tail -4
python3 dev/bias_probe.py --seqlens 2048 --head-dim 64 --variants --out "$OUT/bias-probe-d64.json" 2>&1 | tail -2
BIAS=full OUT=$OUT timeout 150 bash dev/ncu_source.sh bwd "2 16 2048 128" 2>&1 | tail -14
( cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log )
echo "total $(el)"
