#!/usr/bin/env bash
# Session script (s29 call 1, deleted after its run): where the FP8 d128 forward's time goes.
# ncu (full set, clocks not fixed) of the FP8 and the bf16 forward at 1 x 16 x 16k d128, raw
# metrics as CSV; then each kernel run back to back for ~3 s with nvidia-smi sampling the SM
# clock, power and throttle reasons every 50 ms.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
if [ ! -d /tmp/ab-m/flashattn ]; then
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-m \
  -Cbuild-dir=build-ab-m -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >"$OUT/r/pip.log" 2>&1 || { tail -30 "$OUT/r/pip.log"; exit 1; }
fi
export PYTHONPATH=/tmp/ab-m
for pass in fwd8 fwd; do
  k=$([ $pass = fwd8 ] && echo fwd8_kernel || echo fwd_kernel)
  timeout 240 ncu --clock-control none --profile-from-start off -k "regex:$k" --set full --import-source no \
    -f -o /tmp/ncu-$pass python3 dev/profile_attn.py $pass 1 16 16384 128 >"$OUT/r/ncu-$pass.log" 2>&1
  ncu --import /tmp/ncu-$pass.ncu-rep --page raw --csv 2>/dev/null | gzip >"$OUT/r/ncu-raw-$pass.csv.gz"
  ncu --import /tmp/ncu-$pass.ncu-rep --page details 2>/dev/null >"$OUT/r/ncu-details-$pass.txt"
  ncu --import /tmp/ncu-$pass.ncu-rep --page source --print-source sass --csv 2>/dev/null | gzip >"$OUT/r/ncu-src-$pass.csv.gz"
done
timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/r/clock.log"
import subprocess, time, torch, flashattn
b, h, n, d = 1, 16, 16384, 128
q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
flops = 4 * b * h * n * n * d
for tag, args in (("fp8", (q8, k8, v8)), ("bf16", (q, k, v)), ("fp8", (q8, k8, v8))):
    for _ in range(5): flashattn.flash_attn_func(*args)
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); iters = 0
    t0 = time.time()
    while time.time() - t0 < 3.0:
        for _ in range(20): flashattn.flash_attn_func(*args)
        iters += 20
        torch.cuda.synchronize()
    e1.record(); torch.cuda.synchronize()
    smi.terminate(); lines = smi.communicate()[0].strip().splitlines()
    ms = e0.elapsed_time(e1) / iters
    vals = [l.split(", ") for l in lines if l.count(",") >= 3]
    clk = sorted(float(x[0]) for x in vals if x[0].strip().replace('.', '').isdigit())
    pw = sorted(float(x[1]) for x in vals if x[1].strip().replace('.', '').isdigit())
    med = lambda a: a[len(a) // 2] if a else float("nan")
    print(f"{tag}: {ms*1e3:.0f} us {flops/ms/1e9:.0f} TFLOP/s; SM clock median {med(clk)} MHz (min {clk[0] if clk else 0}), power median {med(pw)} W; throttle {sorted(set(x[2] for x in vals))}", flush=True)
PY
tar czf "$OUT/s29c1.tgz" -C "$OUT" r && rm -rf "$OUT/r"
