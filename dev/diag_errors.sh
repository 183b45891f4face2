#!/usr/bin/env bash
# Diagnoses the test_errors.py segfault seen only on the GPU machine image (issue 4): the same
# calls standalone, with and without torch imported and with the GPU hidden, then under ASan in
# a CPU-only build of the extension. Run from the repository root after pip install.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -c "import flashattn, flashattn._C as c, numpy, nanobind; print(c.__file__, numpy.__version__, nanobind.__version__)"
for mode in "" torch; do
  echo "-- standalone ${mode:-without torch}"; python3 -X faulthandler dev/repro_errors.py $mode 2>&1 | head -12
done
echo "-- GPU hidden"; CUDA_VISIBLE_DEVICES= python3 -X faulthandler dev/repro_errors.py torch 2>&1 | head -8
echo "-- ASan, CPU-only build"
python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/flashattn-asan -Cbuild-dir=build-asan \
  -Ccmake.define.FLASHATTN_ENABLE_CUDA=OFF "-Ccmake.define.CMAKE_CXX_FLAGS=-fsanitize=address -fno-omit-frame-pointer -g" \
  "-Ccmake.define.CMAKE_SHARED_LINKER_FLAGS=-fsanitize=address" . >/tmp/asan-pip.log 2>&1 || tail -5 /tmp/asan-pip.log
ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD=$(gcc -print-file-name=libasan.so) PYTHONPATH=/tmp/flashattn-asan \
  python3 dev/repro_errors.py torch 2>&1 | head -40
