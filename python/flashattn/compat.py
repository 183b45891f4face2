"""``import flash_attn`` (and FlashAttention-3's ``import flash_attn_interface``) served by
flashattn: opt-in import aliases for code that cannot be edited (a model repository's modeling
file, FlashAttention's own test suite).

    import flashattn
    flashattn.install_as_flash_attn()
    from flash_attn import flash_attn_func                  # flashattn.flash_attn_func
    from flash_attn.bert_padding import unpad_input         # flashattn.bert_padding.unpad_input

It only registers names in ``sys.modules``: every module behind them is flashattn's own, with
flashattn's arguments and behaviour (the differences from flash_attn are listed in
flashattn.flash_attn_interface). Nothing adapts arguments. A flash_attn module the alias does
not provide (``flash_attn.ops``, ``flash_attn.modules``, ...) fails to import with
ModuleNotFoundError.
"""

from __future__ import annotations

import importlib
import sys

# flash_attn's module name -> the flashattn module that serves it.
ALIASES = {
    "flash_attn": "flashattn",
    "flash_attn.flash_attn_interface": "flashattn.flash_attn_interface",
    "flash_attn.bert_padding": "flashattn.bert_padding",
    "flash_attn.layers": "flashattn.layers",
    "flash_attn.layers.rotary": "flashattn.layers.rotary",
}


def _install(aliases: dict, caller: str) -> None:
    for alias, target in aliases.items():
        present = sys.modules.get(alias)
        if present is not None and present.__name__ != target:
            raise RuntimeError(
                f"{alias} is already imported from {getattr(present, '__file__', present)!r}; "
                f"call flashattn.{caller}() before anything imports {alias}")
    # Import every target first: the submodules then exist as attributes of their parents, so
    # both `import flash_attn.layers.rotary` and `flash_attn.layers.rotary.f` resolve.
    modules = {alias: importlib.import_module(target) for alias, target in aliases.items()}
    sys.modules.update(modules)


def install_as_flash_attn_interface() -> None:
    """Makes ``import flash_attn_interface`` (FlashAttention-3's module) resolve to
    ``flashattn.fa3``, FlashAttention-3's functions served by flashattn, for the rest of the
    process. Raises RuntimeError when a real flash_attn_interface is already imported."""
    _install({"flash_attn_interface": "flashattn.fa3"}, "install_as_flash_attn_interface")


def install_as_flash_attn() -> None:
    """Makes ``import flash_attn`` (and the submodules in ``ALIASES``) resolve to flashattn's
    modules for the rest of the process. Call it before anything imports flash_attn; calling it
    again is harmless. Needs torch (the padding and rotary helpers are torch code).

    Raises RuntimeError when a real flash_attn module is already imported: replacing it under
    code that holds references to it would mix the two libraries silently.
    """
    _install(ALIASES, "install_as_flash_attn")
