#!/usr/bin/env bash
# s31 call 2 (session script, deleted at the session's end): the whole build (every head dim,
# bf16 and fp16, sm_90) with gpu-check.sh, the decode split counts against the heuristic at the
# shapes below cuDNN (b64 x 4k, b1 x 128k), then ctest under auto and sm90 (no `large`).
# Call 3 (BUILD=0 on the warm machine) runs pytest and the sanitizers.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TESTS=0 SUITE=none bash scripts/gpu-check.sh 2>&1 | tail -8
python3 -c "import flashattn, torch; print(flashattn.__file__, torch.__version__)"
{
  python3 dev/decode_splits.py --shapes 64x4096,64x16384 --splits 0,2,3,4,5,6,8 --repeats 30 --out "$OUT/splits-b64.json"
  python3 dev/decode_splits.py --shapes 1x131072,8x65536 --splits 0,8,12,16,24,32,48,64 --repeats 30 --out "$OUT/splits-long.json"
} 2>&1 | tee "$OUT/splits.txt"
BUILD=0 TESTS=ctest LARGE=0 SUITE=none timeout 250 bash scripts/gpu-check.sh 2>&1 | tail -12
for p in auto sm90; do grep -E "tests passed|tests failed|\*\*\*Failed|Timeout" "$OUT/ctest-$p.log" | head -20; done
gzip -f "$OUT"/ctest-*.log "$OUT"/build.log "$OUT"/pip.log 2>/dev/null
ls "$OUT"
