"""flashattn as an attention backend of Hugging Face transformers (5.x).

    import flashattn.integrations.transformers          # registers "fattn"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fattn")

Importing this module registers :func:`attention_forward` with transformers'
``AttentionInterface`` and transformers' FlashAttention mask function (a 2D padding mask, or
None without padding) with ``AttentionMaskInterface``, under the name ``"fattn"`` (call
:func:`register` for another name). The name avoids "flash" on purpose: transformers 5 sends
every implementation whose name contains "flash" to its own flash-attention loader (the
``flash_attn`` package or a kernel from the hub), which fails for a name it does not know
(seen with transformers 5.17 on the H200, 2026-12-01). The calling conventions are those of transformers'
flash-attention-2 integration:

* query (batch, heads, seq_q, head_dim), key/value (batch, heads_k, seq_k, head_dim) in; the
  output is (batch, seq_q, heads, head_dim), and the second result (attention weights) None.
* Padding: a 2D 0/1 ``attention_mask`` (batch, seq_k) unpads the batch into a varlen call
  (the queries are the last seq_q positions of each row, as with a KV cache); padded query rows
  come back as zeros. Packed sequences: ``cu_seq_lens_q/k`` + ``max_length_q/k`` keyword
  arguments, or ``position_ids`` that restart at 0 inside one row.
* ``sliding_window=w``: each query sees the w most recent keys, itself included, i.e.
  flash_attn's ``window_size=(w - 1, w - 1)`` with causal (which clamps the right side to 0),
  as transformers passes it to flash_attn and as its SDPA mask reads
  ``kv_idx > q_idx - sliding_window``.
* ``softcap``, ``scaling`` (softmax scale), ``dropout`` as given; causal from
  ``module.is_causal`` (or an ``is_causal`` keyword); GQA/MQA without repeating k and v.
* Chunked-attention layers (Llama 4: ``layer_types[i] == "chunked_attention"``, chunk
  ``attention_chunk_size``): on whole sequences (training, prefill) with more keys than one chunk,
  each (row, chunk) runs as one sequence of a varlen call (exact; the chunk boundaries are found
  on the host: a device synchronisation per forward, the layers sharing one mask). A call with a
  KV cache (fewer queries than keys) whose keys, cached and new, reach chunk_size raises
  NotImplementedError: transformers' cache for such a layer then holds its last chunk_size - 1
  keys and passes neither their positions nor a mask (it refuses that case for flash_attention_2
  too); below that, decoding runs as usual. Sequences packed into one row and marked only by
  position_ids are not detected when the model does not pass position_ids to its attention (Llama
  4 does not), as with transformers' flash_attention_2.
* ``s_aux`` (gpt-oss's attention sinks, ``(heads,)`` logits of any float dtype) becomes
  ``learnable_sink``: each row's softmax denominator gains ``exp(s_aux[h] - m)``, as in
  transformers' eager gpt-oss attention, and the sinks get their gradient.
* float32 inputs on a GPU run in the module's half dtype (the CUDA backend has no float32) and
  come back in float32, as transformers' integration does.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch

from ..bert_padding import index_first_axis, pad_input, unpad_input
from ..flash_attn_interface import flash_attn_func, flash_attn_varlen_func

NAME = "fattn"


def _half_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype a float32 call runs in on the GPU: autocast's, else the module's weights' when
    they are half, else bfloat16."""
    if torch.is_autocast_enabled():
        return torch.get_autocast_gpu_dtype()
    for p in module.parameters():
        if p.dtype in (torch.float16, torch.bfloat16):
            return p.dtype
    return torch.bfloat16


def _packed_from_position_ids(position_ids: torch.Tensor, seq: int):
    """cu_seqlens (int32) and the longest sequence of one row of packed sequences (positions
    restarting at 0), or None when the row is a single sequence."""
    pos = position_ids.reshape(-1)[:seq]
    if pos.numel() < 2 or bool((torch.diff(pos) >= 0).all()):
        return None
    starts = torch.nonzero(pos == 0, as_tuple=False).flatten().to(torch.int32)
    if starts.numel() == 0 or int(starts[0]) != 0:
        return None
    end = torch.tensor([pos.numel()], dtype=torch.int32, device=pos.device)
    cu = torch.cat([starts, end])
    return cu, int(torch.diff(cu).max())


def _attention_chunk(module: torch.nn.Module) -> Optional[int]:
    """The chunk size of a chunked-attention layer (Llama 4: `layer_types[i] ==
    "chunked_attention"` with `attention_chunk_size`), else None."""
    config = getattr(module, "config", None)
    types = getattr(config, "layer_types", None)
    index = getattr(module, "layer_idx", None)
    if types is None or index is None or not 0 <= index < len(types):
        return None
    if types[index] != "chunked_attention":
        return None
    return getattr(config, "attention_chunk_size", None)


# The last chunk segments built, reused while the same mask object (unchanged) and shapes come
# back: transformers passes one mask to every chunked layer of a forward, so the host
# synchronisation happens once per forward rather than once per layer.
_SEGMENTS = {"key": None, "mask": None, "value": None}


def _chunk_segments(attention_mask, batch: int, seq_q: int, seq_k: int, chunk: int, device):
    """(q_index, k_index, cu_q, cu_k, max_q, max_k) of the chunk segments (_chunked_attention),
    on `device`, or None when no query is a real token."""
    version = None if attention_mask is None else attention_mask._version
    key = (version, batch, seq_q, seq_k, chunk, str(device))
    held = _SEGMENTS["mask"]
    same_mask = (attention_mask is None and held is None) or (
        attention_mask is not None and held is not None and held() is attention_mask)
    if same_mask and _SEGMENTS["key"] == key:
        return _SEGMENTS["value"]
    if attention_mask is None:
        mask = torch.ones(batch, seq_k, dtype=torch.bool)
    else:
        mask = attention_mask[:, -seq_k:].to(device="cpu", dtype=torch.bool)
    left_pad = (mask.cumsum(-1) == 0).sum(-1)
    q_index, k_index, cu_q, cu_k = [], [], [0], [0]
    for b in range(batch):
        keys = torch.nonzero(mask[b]).flatten()
        ids = torch.div(keys - left_pad[b], chunk, rounding_mode="floor")
        is_query = keys >= seq_k - seq_q
        for c in torch.unique(ids[is_query]).tolist():
            in_chunk = ids == c
            ks, qs = keys[in_chunk], keys[in_chunk & is_query]
            k_index.append(ks + b * seq_k)
            q_index.append(qs - (seq_k - seq_q) + b * seq_q)
            cu_k.append(cu_k[-1] + ks.numel())
            cu_q.append(cu_q[-1] + qs.numel())
    value = None
    if len(cu_q) > 1:
        value = (torch.cat(q_index).to(device), torch.cat(k_index).to(device),
                 torch.tensor(cu_q, dtype=torch.int32, device=device),
                 torch.tensor(cu_k, dtype=torch.int32, device=device),
                 max(b - a for a, b in zip(cu_q, cu_q[1:])),
                 max(b - a for a, b in zip(cu_k, cu_k[1:])))
    _SEGMENTS.update(key=key, value=value,
                     mask=None if attention_mask is None else weakref.ref(attention_mask))
    return value


def _chunked_attention(q, k, v, attention_mask, chunk: int, options: dict) -> torch.Tensor:
    """Chunked causal attention (transformers' chunked_causal_mask_function): query i sees key j
    iff j <= i, both are real tokens and (j - lp) // chunk == (i - lp) // chunk, lp being the
    row's left padding, so that chunks start at each sequence's first token. Exact, as one varlen
    call: each (row, chunk) is a sequence whose keys are the chunk's real keys and whose queries
    are its real queries, which are the last of those keys (the queries are the last seq_q
    positions of the keys), so the varlen call's bottom-right causal mask is the chunk's.
    q (batch, seq_q, heads, dim), k / v (batch, seq_k, heads_k, dim), attention_mask the 2D
    padding mask (its last seq_k columns are the keys') or None. The segments are built on the
    host (one device synchronisation per new mask: _chunk_segments)."""
    batch, seq_q = q.shape[:2]
    seq_k = k.shape[1]
    out = q.new_zeros(batch * seq_q, q.shape[2], v.shape[3])
    segments = _chunk_segments(attention_mask, batch, seq_q, seq_k, chunk, q.device)
    if segments is None:  # no real query
        return out.view(batch, seq_q, *out.shape[1:])
    q_index, k_index, cu_q, cu_k, max_q, max_k = segments
    rows = flash_attn_varlen_func(
        q.reshape(-1, *q.shape[2:]).index_select(0, q_index),
        k.reshape(-1, *k.shape[2:]).index_select(0, k_index),
        v.reshape(-1, *v.shape[2:]).index_select(0, k_index),
        cu_q, cu_k, max_q, max_k, **options)
    return out.index_copy(0, q_index, rows).view(batch, seq_q, *out.shape[1:])


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      scaling: Optional[float] = None, dropout: float = 0.0,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      **kwargs):
    """transformers' attention-function signature; see the module docs for the conventions."""
    # gpt-oss passes its per-head sink logits as s_aux; transformers' own flash integration
    # forwards them to FlashAttention-4 as learnable_sink, the keyword every flashattn function
    # takes (float32 inside; autograd returns their gradient in the sink's dtype).
    sink = kwargs.get("s_aux")
    if sink is None:
        sink = kwargs.get("learnable_sink")
    if kwargs.get("sinks") is not None:
        raise NotImplementedError("flashattn's transformers integration: `sinks` (per-token "
                                  "attention sinks) are not supported; per-head sinks are, as "
                                  "s_aux")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            "flashattn's transformers integration takes a 2D padding mask (batch, seq_k); got "
            f"shape {tuple(attention_mask.shape)} (register it with AttentionMaskInterface, "
            "as importing flashattn.integrations.transformers does)")
    batch, heads, seq_q, _ = query.shape
    seq_k = key.shape[2]
    # (batch, heads, seq, dim) -> (batch, seq, heads, dim): views, no copy.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    in_dtype = q.dtype
    if q.is_cuda and in_dtype == torch.float32:
        half = _half_dtype(module)
        q, k, v = q.to(half), k.to(half), v.to(half)

    causal = kwargs.get("is_causal")
    if causal is None:
        causal = bool(getattr(module, "is_causal", True))
    window = (sliding_window - 1, sliding_window - 1) if sliding_window and sliding_window > 0 else (-1, -1)
    options = dict(dropout_p=float(dropout), softmax_scale=scaling, causal=bool(causal),
                   window_size=window, softcap=float(softcap or 0.0),
                   deterministic=bool(kwargs.get("deterministic") or False),
                   learnable_sink=sink)

    chunk = _attention_chunk(module)
    if chunk is not None and seq_q < seq_k and seq_k >= chunk:
        # A chunked layer reading a cache: transformers keeps its last chunk_size - 1 keys and
        # passes no mask, so the keys' positions, and with them the chunk boundaries, are not
        # known here (transformers refuses this case for its flash implementations too).
        raise NotImplementedError(
            "flashattn's transformers integration: chunked attention (attention_chunk_size = "
            f"{chunk}) with a KV cache whose keys, cached and new, number {seq_k} >= {chunk}: "
            "the cache passes no positions, so the chunk boundaries are not known to the "
            "attention function; use another attn_implementation to decode this far")
    if chunk is not None and seq_k > chunk:
        # Llama 4's chunked layers on a whole sequence (training, prefill): more keys than one
        # chunk, so the chunks cut the causal mask.
        packed = (kwargs.get("cu_seq_lens_q") is not None or
                  (batch == 1 and seq_q == seq_k and kwargs.get("position_ids") is not None and
                   _packed_from_position_ids(kwargs["position_ids"], seq_q) is not None))
        if not causal or packed or sliding_window:
            raise NotImplementedError(
                "flashattn's transformers integration: chunked attention (attention_chunk_size) "
                "is supported for causal layers on padded batches, without packed sequences or "
                "a sliding window")
        out = _chunked_attention(q, k, v, attention_mask, int(chunk), options)
    elif attention_mask is not None:
        kv_mask = attention_mask[:, -seq_k:].to(torch.bool)
        q_mask = kv_mask[:, -seq_q:]
        q_rows, q_index, cu_q, max_q, _ = unpad_input(q, q_mask)
        k_rows, k_index, cu_k, max_k, _ = unpad_input(k, kv_mask)
        v_rows = index_first_axis(v.reshape(-1, *v.shape[2:]), k_index)
        out_rows = flash_attn_varlen_func(q_rows, k_rows, v_rows, cu_q, cu_k, max_q, max_k,
                                          **options)
        out = pad_input(out_rows, q_index, batch, seq_q)
    else:
        cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        packed = None
        if cu_q is None and batch == 1 and seq_q == seq_k and kwargs.get("position_ids") is not None:
            packed = _packed_from_position_ids(kwargs["position_ids"], seq_q)
            if packed is not None:
                cu_q = cu_k = packed[0]
                max_q = max_k = packed[1]
        if cu_q is not None and cu_k is not None and max_q and max_k:
            out = flash_attn_varlen_func(
                q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]),
                v.reshape(-1, *v.shape[2:]), cu_q.to(torch.int32), cu_k.to(torch.int32),
                int(max_q), int(max_k), **options)
            out = out.view(batch, seq_q, *out.shape[1:])
        else:
            out = flash_attn_func(q, k, v, **options)
    return out.to(in_dtype), None


def register(name: str = NAME) -> None:
    """Registers flashattn with transformers under `name` (attention and its mask function)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)


register()
