"""The two calls of tests/python/test_errors.py::test_shape_mismatches_name_the_argument that
segfault on the GPU machine image, standalone, with a line before each (dev/diag_errors.sh).
Usage: repro_errors.py [torch]  (import torch first, as pytest's conftest does)."""
import sys

if "torch" in sys.argv[1:]:
    import torch  # noqa: F401

import numpy as np

import flashattn

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


q, k, v = randn(2, 8, 4, 16), randn(2, 8, 4, 16), randn(2, 8, 4, 16)
for name, args in (("k head_dim 8", (q, randn(2, 8, 4, 8), v)), ("v seqlen 9", (q, k, randn(2, 9, 4, 16))),
                   ("k batch 3", (q, randn(3, 8, 4, 16), randn(3, 8, 4, 16)))):
    print("call:", name, flush=True)
    try:
        flashattn.flash_attn_func(*args)
    except ValueError as e:
        print("  ValueError:", e, flush=True)
print("no crash", flush=True)
