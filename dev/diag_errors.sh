#!/usr/bin/env bash
# Diagnoses the test_errors.py segfault seen only on the GPU machine image (issue 4). Builds
# debug-info copies of the extension into /tmp/fa-dbg-* (no install; nothing else on the
# machine changes), runs dev/repro_errors.py and tests/python/test_errors.py against it with a
# native backtrace on SIGSEGV (dev/segv_trace.c) and under gdb if present, and copies the
# extension to $OUT for addr2line here. Run from the repository root.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}
mkdir -p "$OUT"
echo "-- toolchain: $(command -v g++) $(g++ -dumpfullversion); CXX=${CXX:-unset} CC=${CC:-unset}; gdb: $(command -v gdb || echo none)"
ls /opt/gcc 2>/dev/null | head -3
gcc -shared -fPIC -O0 -g dev/segv_trace.c -o /tmp/segv_trace.so || exit 1
py=$(python3 -c "import sys; print(sys.executable)")
# Two debug-info builds: CPU-only, and CUDA trimmed to d128 bf16 (like the crashing build, which
# has the CUDA backend).
for variant in cpu cuda; do
  target=/tmp/fa-dbg-$variant
  flags=(-Ccmake.define.FLASHATTN_ENABLE_CUDA=OFF)
  [ $variant = cuda ] && flags=(-Ccmake.define.FLASHATTN_ENABLE_CUDA=ON -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90
    -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16)
  echo "== variant $variant"
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps -q --target $target \
    -Cbuild-dir=build-dbg-$variant -Ccmake.build-type=RelWithDebInfo "${flags[@]}" . \
    >"$OUT/dbg-pip-$variant.log" 2>&1 || { tail -20 "$OUT/dbg-pip-$variant.log"; continue; }
  so=$(ls $target/flashattn/_C*.so); cp "$so" "$OUT/$variant-$(basename "$so")"; echo "extension: $so"
  [ $variant = cpu ] && { ldd "$so"; grep -m2 -E "CMAKE_CXX_COMPILER:|CMAKE_CXX_FLAGS_RELWITHDEBINFO:" build-dbg-$variant/CMakeCache.txt; }
  for mode in "" torch; do
    log="$OUT/dbg-$variant-repro-${mode:-plain}.log"
    PYTHONPATH=$target LD_PRELOAD=/tmp/segv_trace.so python3 dev/repro_errors.py $mode >"$log" 2>&1
    echo "-- repro ${mode:-without torch}: exit $?"
    grep -v -E " (r--p|rw-p|---p) " "$log" | grep -v -E "r-xp .*(python3|libc\.|ld-linux|numpy|torch|libm\.|libz|libgcc|libffi|libexpat)" | head -50
  done
  log="$OUT/dbg-$variant-pytest.log"
  PYTHONPATH=$target LD_PRELOAD=/tmp/segv_trace.so python3 -m pytest tests/python/test_errors.py -q -x -p no:cacheprovider >"$log" 2>&1
  echo "-- pytest test_errors: exit $?"; grep -A25 "segv_trace" "$log" | head -30; tail -3 "$log"
  if command -v gdb >/dev/null; then
    echo "-- gdb"
    PYTHONPATH=$target timeout 120 gdb -q -batch -ex run -ex bt -ex "info registers rip" --args "$py" dev/repro_errors.py torch 2>&1 | tail -30
  fi
done
