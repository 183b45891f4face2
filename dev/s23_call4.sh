#!/usr/bin/env bash
# Session script (s23 call 4, deleted after its run; carry .carry/fa4b on the machine call 3
# left warm): joins FA4's wheel, installs FA4 (as scripts/gpu-check.sh FA4_WHEELS does), then
# bench.py's full suite at d64, bf16, ours (the branch, installed by call 3) / cuDNN / FA4 in one process.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
[ -f /tmp/fa4w/cu13.part.aa ] || { echo "cold machine: call 3's half is gone"; exit 1; }
python3 -c "import flashattn" || { echo "call 3's package is gone"; exit 1; }
cp .carry/fa4b/*.whl /tmp/fa4w/
cat /tmp/fa4w/cu13.part.aa .carry/fa4b/cu13.part.ab > /tmp/fa4w/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
rm /tmp/fa4w/cu13.part.aa
site=/tmp/fa4-site
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
  $(ls /tmp/fa4w/*.whl | grep -v cutlass_dsl_libs_core) >"$OUT/r/fa4-install.log" 2>&1 || tail -5 "$OUT/r/fa4-install.log"
cp .carry/fa4b/nvidia_cutlass_dsl_libs_core-*.whl /tmp/fa4w/ 2>/dev/null
python3 -c "import sys, zipfile, glob; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob(sys.argv[2] + '/*cutlass_dsl_libs_core*.whl')]" "$site" /tmp/fa4w
export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages"
python3 -c "from flash_attn.cute import flash_attn_func; print('fa4 imports')" 2>&1 | tail -2
echo "$(el) fa4 installed"
python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn,fa4 --dtypes bf16 --head-dims 64 --repeats 15 \
  --out "$OUT/r/full-d64-fa4.json" >"$OUT/r/bench.log" 2>&1
echo "$(el) bench rc=$?"
grep -E "^bf16 " "$OUT/r/bench.log" | head -30
echo "total $(el)"
tar czf "$OUT/s23c4.tgz" -C "$OUT" r && rm -rf "$OUT/r"
