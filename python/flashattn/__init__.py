"""flashattn: exact, IO-aware attention (FlashAttention) on CPUs and NVIDIA GPUs.

The flash_attn 2.x functions (``flash_attn_func``, ``flash_attn_varlen_func`` and the packed
variants) take torch tensors (autograd, ``torch.compile``) or any DLPack array (forward only),
so ``import flashattn as flash_attn`` runs existing model code; code that must keep its
``import flash_attn`` lines runs after ``flashattn.install_as_flash_attn()`` (flashattn.compat,
with ``bert_padding`` and ``layers.rotary`` served by flashattn's own modules). The device of
the tensors picks the backend: CPU (float32, float16, bfloat16) or CUDA (float16, bfloat16).

Block-sparse masks: ``block_mask=`` takes a dense block table or a ``BlockMask`` (per query
block the partial and full key blocks, FlexAttention's layout), built with
``block_mask_from_dense``, ``block_mask_from_mask_mod`` or ``block_mask_from_flex``.

``forward``/``backward`` are the low-level entry points for any DLPack framework: they write
into outputs the caller preallocated, on the caller's stream.

Errors: ``TypeError`` for a dtype problem (naming the argument), ``ValueError`` for any other
invalid argument (shape, stride, device, option), ``NotImplementedError`` for a valid request
this build or backend cannot run (e.g. CUDA tensors with a CPU-only build, an unsupported head
dim), ``RuntimeError`` for CUDA and internal errors. See python/README.md.
"""

from . import _C
from ._lowlevel import backward, check_paged_metadata, check_varlen_metadata, forward
from .compat import install_as_flash_attn, install_as_flash_attn_interface
from .flash_attn_interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from ._lowlevel import forward_kvcache
from .block_sparse import (
    BlockMask,
    block_mask_from_dense,
    block_mask_from_flex,
    block_mask_from_mask_mod,
)

__version__: str = _C.version()


def cuda_available() -> bool:
    """Whether this build has the CUDA backend and at least one usable GPU."""
    return bool(_C.cuda_available())


def cuda_built() -> bool:
    """Whether this build contains the CUDA backend (whether or not a GPU is present)."""
    return bool(_C.cuda_built())


__all__ = [
    "BlockMask",
    "__version__",
    "backward",
    "block_mask_from_dense",
    "block_mask_from_flex",
    "block_mask_from_mask_mod",
    "check_paged_metadata",
    "check_varlen_metadata",
    "cuda_available",
    "cuda_built",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "forward",
    "forward_kvcache",
    "install_as_flash_attn",
    "install_as_flash_attn_interface",
]
