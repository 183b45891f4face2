"""The torch module for a CUDA test, or a skip naming what is missing (a CPU-only build, no usable
GPU, a CPU-only torch). Shared by the KV-cache and MLA tests."""
import pytest

import flashattn


def cuda_torch():
    torch = pytest.importorskip("torch")
    if not flashattn.cuda_built():
        pytest.skip("flashattn was built without the CUDA backend")
    if not flashattn.cuda_available() or not torch.cuda.is_available():
        pytest.skip("no usable CUDA GPU")
    return torch
