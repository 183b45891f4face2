#!/usr/bin/env bash
# s30 call 10: smoke check of the review's host refactor (cluster facts in kernel_facts) and the
# epilogue's LSE store: cluster launches counted, bitwise against the counter merge and the
# combine kernel, and the graph-replay decode test.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; R=$(pwd)
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-py \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > $OUT/pip.log 2>&1 || { tail -20 $OUT/pip.log; exit 1; }
cd /tmp
timeout 40 python3 - <<'PY' 2>&1 | tee $OUT/smoke.txt
import torch, flashattn
from flashattn import _lowlevel
torch.manual_seed(0)
for b, sk, splits in ((1, 4096, 0), (2, 4096, 3), (1, 300, 2), (3, 2000, 5), (8, 8192, 0)):
    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    outs = []
    for sw in (None, "split_combine_counter", "split_combine_kernel"):
        was = flashattn._C._set_switch(sw, True) if sw else None
        o = torch.empty_like(q); lse = torch.empty(b, 32, 1, device="cuda", dtype=torch.float32)
        c0 = flashattn._C._split_cluster_launches()
        _lowlevel.forward(q, k, v, o, lse, num_splits=splits); torch.cuda.synchronize()
        outs.append((o, lse, flashattn._C._split_cluster_launches() - c0))
        if sw: flashattn._C._set_switch(sw, was)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(), enable_gqa=True).transpose(1, 2)
    print(b, sk, splits, "clusters", [x[2] for x in outs], "bitwise", all(torch.equal(outs[0][0], x[0]) and torch.equal(outs[0][1], x[1]) for x in outs[1:]),
          "max err %.2e" % (outs[0][0].float() - ref).abs().max().item(), flush=True)
PY
timeout 60 python3 -m pytest -q -x $R/tests/python/test_cuda.py -k "decode_split_kv_replays" 2>&1 | tail -2
