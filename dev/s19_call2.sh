#!/usr/bin/env bash
# Session script (s19 call 2, deleted after its run): the Hopper bias backward (BwdBiasTraits) on
# one build (d64;128, bf16 and fp16): test_bias.py under auto and sm90, test_cuda's backward cases,
# memcheck / racecheck / synccheck of the two bias backward sanitizer cases, then dev/bias_probe.py
# (ours on sm90 and sm80 against SDPA cuDNN / efficient, one process).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" . >"$OUT/pip.log" 2>&1 \
  || { tail -30 "$OUT/pip.log"; exit 1; }
echo "$(el) built"; grep -h "spill" "$OUT/pip.log" | sort | uniq -c | head -5
run() { local path=$1 name=$2; shift 2
  ( [ "$path" = auto ] || export FLASHATTN_CUDA_PATH=$path
    python3 -m pytest "$@" -q -rs -p no:cacheprovider >"$OUT/t-$name.log" 2>&1
    echo "$(el) $name: $(tail -1 "$OUT/t-$name.log")"; grep -E "^(FAILED|ERROR)" "$OUT/t-$name.log" | head -8 ); }
run auto bias-auto tests/python/test_bias.py &
run sm90 bias-sm90 tests/python/test_bias.py -k "sm90 or backward or dbias" &
run auto cuda-bwd tests/python/test_cuda.py -k "backward or grad" &
wait
san() { FLASHATTN_CUDA_PATH=sm90 timeout 200 compute-sanitizer --tool $1 --error-exitcode 9 python3 dev/san_cases.py \
          --only bwd_bias_d128_causal,bwd_bias_d64_keypad >"$OUT/san-$1.log" 2>&1
        echo "$(el) $1 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$1.log" | tail -1) $(grep -cE ' ok$' "$OUT/san-$1.log") ok, $(grep -c FAIL "$OUT/san-$1.log") FAIL"; }
san memcheck & san racecheck & san synccheck & wait
python3 dev/bias_probe.py --seqlens 2048,8192 --sm80 --out "$OUT/bias-probe.json" 2>&1 | tail -4
( cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log )
echo "total $(el)"
