"""flashattn as a transformers attention backend (flashattn.integrations.transformers): tiny
randomly initialised Llama-, Mistral- (sliding window), Qwen2-, gpt-oss-style (attention sinks,
alternating sliding and full layers) and Llama-4-style (chunked attention) models run with
attn_implementation="fattn" (flashattn) and with a transformers implementation (SDPA; eager for
gpt-oss, which has no SDPA path) in bfloat16 on a padded batch; logits and parameter gradients
must agree within bfloat16 noise. A greedy decode through transformers' KV cache is checked the
same way.

Tolerance: both bfloat16 models are compared with the same model (same bfloat16-rounded
weights) computed in float32 with the transformers implementation. flashattn passes when, per
tensor,
    max|flashattn_bf16 - peer_fp32| <= 2 * max|peer_bf16 - peer_fp32| + 0.01 * max|peer_fp32|,
i.e. its error is at most twice the error bfloat16 itself costs transformers' own attention
(DESIGN.md's criterion), with a 1% floor for tensors whose bf16 error happens to be tiny.

Every test runs on the CPU backend and, when there is a usable GPU, on the CUDA backend (the
one transformers users run). Each checks that the flashattn model really called flashattn's
attention (transformers keeps one config object per model: a second model built from the same
config object would silently switch the first one's attention implementation). Skipped without
transformers."""

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashattn  # noqa: E402
import flashattn.integrations.transformers as fa_hf  # noqa: E402  (registers "fattn")

try:
    from transformers import AttentionInterface, GptOssConfig  # noqa: F401
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
except ImportError as e:  # transformers older than the integration's (5.x, gpt-oss)
    pytest.skip(f"transformers {transformers.__version__} lacks {e.name or e}",
                allow_module_level=True)

DEVICES = ["cpu"]
if flashattn.cuda_built() and flashattn.cuda_available() and torch.cuda.is_available():
    DEVICES.append("cuda")

# A counting wrapper around the integration, registered under its own name: a test reads the
# count to know that flashattn's attention ran (and with sinks where the model has them).
COUNTED = "fattn-counted"
CALLS = []


def _counted(module, query, key, value, attention_mask, **kwargs):
    CALLS.append(kwargs.get("s_aux") is not None)
    return fa_hf.attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(COUNTED, _counted)
AttentionMaskInterface.register(COUNTED, flash_attention_mask)

COMMON = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def configs():
    """arch -> (config, the transformers implementation it is compared with)."""
    return {
        "llama": (transformers.LlamaConfig(**COMMON), "sdpa"),
        # A window shorter than the sequences, so that it masks something.
        "mistral": (transformers.MistralConfig(**COMMON, sliding_window=16), "sdpa"),
        "qwen2": (transformers.Qwen2Config(**COMMON), "sdpa"),
        # gpt-oss: sinks, a sliding layer then a full one, head_dim 64. Two experts, both taken
        # by every token, so that the router's choice cannot flip between implementations.
        "gpt_oss": (transformers.GptOssConfig(
            vocab_size=1000, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=2,
            num_experts_per_tok=2, sliding_window=16, max_position_embeddings=512,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "eager"),
        # Llama 4: a chunked-attention layer (chunks of 8, so that every batch below spans
        # several) and a full one; one expert, so that routing cannot flip.
        "llama4": (transformers.Llama4TextConfig(
            vocab_size=1000, hidden_size=256, intermediate_size=256, intermediate_size_mlp=512,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            num_local_experts=1, num_experts_per_tok=1, attention_chunk_size=8,
            no_rope_layers=[1, 0], max_position_embeddings=512), "sdpa"),
    }


def build(config, attn, dtype, device, state=None):
    torch.manual_seed(0)
    # One config object per model (see the module docs).
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config),
                                                          attn_implementation=attn)
    model = model.to(device=device, dtype=dtype)
    if state is None:
        with torch.no_grad():
            for m in model.modules():
                if hasattr(m, "sinks"):  # initialised to zeros-ish; make them matter
                    m.sinks.normal_(0.0, 2.0)
    else:
        model.load_state_dict(state)
    model.train()  # dropout is 0 in these configs; train mode exercises the backward path
    return model


def models(arch, device):
    """(flashattn bf16, peer bf16, peer fp32) with the same weights."""
    config, peer = configs()[arch]
    fa = build(config, COUNTED, torch.bfloat16, device)
    state = {k: v.clone() for k, v in fa.state_dict().items()}
    naive = build(config, peer, torch.bfloat16, device, state)
    ref = build(config, peer, torch.float32, device, {k: v.float() for k, v in state.items()})
    assert fa.config._attn_implementation == COUNTED
    assert naive.config._attn_implementation == peer
    return fa, naive, ref


def run(model, ids, mask, weights):
    logits = model(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    loss = (logits.float()[valid] * weights).sum()
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return logits.detach().float()[valid], grads


def close(name, ours, naive, ref):
    err = (ours - ref).abs().max().item()
    base = (naive - ref).abs().max().item()
    bound = 2 * base + 0.01 * ref.abs().max().item()
    assert err == err and err <= bound, \
        f"{name}: max error {err:.3g} > bound {bound:.3g} (bf16 peer error {base:.3g})"


def padded_batch(device, padding, seed, lengths=(48, 37, 20)):
    g = torch.Generator(device=device).manual_seed(seed)
    batch, seq = len(lengths), max(lengths)
    ids = torch.randint(1, 1000, (batch, seq), generator=g, device=device)
    mask = torch.zeros(batch, seq, dtype=torch.long, device=device)
    for b, n in enumerate(lengths):
        if padding == "left":
            mask[b, seq - n:] = 1
        else:
            mask[b, :n] = 1
    return ids, mask, g


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gpt_oss", "llama4"])
def test_model_matches_transformers(arch, padding, device):
    fa, naive, ref = models(arch, device)
    ids, mask, g = padded_batch(device, padding, seed=1)
    weights = torch.randn(int(mask.sum()), 1000, generator=g, device=device) / 1000

    CALLS.clear()
    out_fa, grads_fa = run(fa, ids, mask, weights)
    # One call per layer, with the sinks exactly where the model has them.
    assert CALLS == [arch == "gpt_oss"] * 2
    out_naive, grads_naive = run(naive, ids, mask, weights)
    out_ref, grads_ref = run(ref, ids, mask, weights)
    close("logits", out_fa, out_naive, out_ref)
    assert grads_fa.keys() == grads_ref.keys()
    if arch == "gpt_oss":
        assert any(n.endswith("self_attn.sinks") for n in grads_ref)
    for name in grads_ref:
        if name.endswith("self_attn.sinks"):
            # A sink's gradient, -sum over rows of p_sink * (dO . O), cancels between rows:
            # its bfloat16 error swings from under 1% to over 80% of its value with the seed
            # for the peer as well. Checked in float32 (CPU, below), and at one attention call
            # against float64 (test_sinks_are_the_eager_gpt_oss_softmax, test_sink.py).
            assert torch.isfinite(grads_fa[name]).all() and grads_fa[name].abs().max() > 0
            continue
        close(f"grad {name}", grads_fa[name], grads_naive[name], grads_ref[name])


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gpt_oss", "llama4"])
def test_float32_model_matches_transformers(arch):
    # The CPU backend computes float32 models in float32 (CUDA runs them in a half dtype), so
    # every logit and gradient, the sinks' included, must match the float32 peer closely.
    config, peer = configs()[arch]
    fa = build(config, COUNTED, torch.float32, "cpu")
    state = {k: v.clone() for k, v in fa.state_dict().items()}
    ref = build(config, peer, torch.float32, "cpu", state)
    ids, mask, g = padded_batch("cpu", "left", seed=5)
    weights = torch.randn(int(mask.sum()), 1000, generator=g) / 1000
    CALLS.clear()
    out_fa, grads_fa = run(fa, ids, mask, weights)
    assert CALLS == [arch == "gpt_oss"] * 2
    out_ref, grads_ref = run(ref, ids, mask, weights)
    assert grads_fa.keys() == grads_ref.keys()
    for name, ours, want in [("logits", out_fa, out_ref)] + [
            (f"grad {n}", grads_fa[n], grads_ref[n]) for n in grads_ref]:
        err = (ours - want).abs().max().item()
        assert err <= 1e-4 * want.abs().max().item(), f"{name}: max error {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", ["llama", "gpt_oss", "llama4"])
def test_cached_decode_matches_transformers(arch, device):
    # Greedy decoding through transformers' KV cache with a left-padded batch: each step's
    # logits (queries = the last position, keys = the cache) against the peer's logits for the
    # same full sequence in one forward.
    fa, naive, ref = models(arch, device)
    for m in (fa, naive, ref):
        m.eval()
    ids, mask, _ = padded_batch(device, "left", seed=3, lengths=(20, 13))
    steps = 4
    if arch == "llama4":
        # A chunked layer's cache holds its last chunk - 1 keys, passed without positions: the
        # integration refuses to decode past the first chunk rather than guess.
        with pytest.raises(NotImplementedError, match="attention_chunk_size = 8"), torch.no_grad():
            fa.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False,
                        pad_token_id=0)
        # Within the first chunk it decodes as usual: prompts of 5 and 3, three new tokens.
        ids, mask, _ = padded_batch(device, "left", seed=3, lengths=(5, 3))
        steps = 3
    CALLS.clear()
    with torch.no_grad():
        gen = fa.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps,
                          min_new_tokens=steps, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0)
    assert len(CALLS) == 2 * steps  # prefill + (steps - 1) decode steps, two layers each
    ours = torch.stack(gen.logits, dim=1).float()  # (batch, steps, vocab)
    full = gen.sequences
    full_mask = torch.cat([mask, torch.ones(mask.shape[0], steps, dtype=mask.dtype,
                                             device=device)], dim=1)
    with torch.no_grad():
        # The logits that chose token t + 1 come from position t - 1 of the full sequence.
        pos = slice(ids.shape[1] - 1, full.shape[1] - 1)
        naive_logits = naive(input_ids=full, attention_mask=full_mask).logits[:, pos].float()
        ref_logits = ref(input_ids=full, attention_mask=full_mask).logits[:, pos].float()
    close("decode logits", ours, naive_logits, ref_logits)


@pytest.mark.parametrize("device", DEVICES)
def test_sliding_window_is_the_last_w_keys(device):
    # transformers' sliding_window=w: query i sees keys i - w + 1 .. i. One attention call
    # against that mask written out directly.
    w, s, h, d = 5, 23, 4, 64
    g = torch.Generator(device=device).manual_seed(2)
    q, k, v = (torch.randn(1, h, s, d, generator=g, device=device, dtype=torch.bfloat16)
               for _ in range(3))

    class Module(torch.nn.Module):
        is_causal = True

    out, _ = fa_hf.attention_forward(Module(), q, k, v, None, scaling=d ** -0.5, sliding_window=w)
    i = torch.arange(s, device=device)
    allowed = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - w)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=allowed)
    torch.testing.assert_close(out.float(), ref.transpose(1, 2), atol=2e-2, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True])
def test_sinks_are_the_eager_gpt_oss_softmax(device, padded):
    # s_aux on one call, against the softmax transformers' eager gpt-oss attention computes
    # (the sink logit joins each row's denominator and is dropped), written out here in
    # float64; padded: a 2D padding mask takes the varlen path. Sink gradients checked too.
    b, h, hk, s, d = 2, 4, 2, 19, 64
    g = torch.Generator(device=device).manual_seed(4)
    q, k, v = (torch.randn(b, n, s, d, generator=g, device=device, dtype=torch.bfloat16)
               for n in (h, hk, hk))
    sinks = (2 * torch.randn(h, generator=g, device=device)).requires_grad_()
    mask = torch.ones(b, s, dtype=torch.long, device=device)
    if padded:
        mask[1, :7] = 0  # left padding of the second row

    class Module(torch.nn.Module):
        is_causal = True

    out, _ = fa_hf.attention_forward(Module(), q, k, v, mask if padded else None,
                                     scaling=d ** -0.5, s_aux=sinks)
    dout = torch.randn(out.shape, generator=g, device=device, dtype=torch.float32)
    (out.float() * dout).sum().backward()

    sinks64 = sinks.detach().double().requires_grad_()
    q64, k64, v64 = (t.double().repeat_interleave(h // t.shape[1], dim=1) for t in (q, k, v))
    scores = q64 @ k64.transpose(2, 3) * d ** -0.5
    i = torch.arange(s, device=device)
    keep = (i[None, :] <= i[:, None])[None, None] & mask.bool()[:, None, None, :]
    scores = scores.masked_fill(~keep, float("-inf"))
    logits = torch.cat([scores, sinks64.view(1, h, 1, 1).expand(b, h, s, 1)], dim=-1)
    probs = torch.softmax(logits, dim=-1)[..., :-1]
    ref = (probs @ v64).transpose(1, 2)  # (b, s, h, d)
    valid = mask.bool()  # padded query rows come back as zeros from the integration
    ref = ref * valid[:, :, None, None]
    (ref * dout.double()).sum().backward()
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-2, rtol=0)
    torch.testing.assert_close(sinks.grad.double(), sinks64.grad,
                               atol=2e-2 * sinks64.grad.abs().max().item(), rtol=0)


def test_chunk_segments_are_built_once_per_mask():
    # Every chunked layer of a forward gets the same mask object: one host synchronisation.
    segments = fa_hf._chunk_segments
    cpu = torch.device("cpu")
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :3] = 0
    first = segments(mask, 2, 20, 20, 8, cpu)
    again = segments(mask, 2, 20, 20, 8, cpu)
    assert again is first  # reused
    mask[0, 0] = 0  # changed in place: rebuilt
    changed = segments(mask, 2, 20, 20, 8, cpu)
    assert changed is not first and not torch.equal(changed[1], first[1])
    other = segments(mask.clone(), 2, 20, 20, 8, cpu)
    assert other is not changed  # another tensor object: rebuilt
    assert segments(None, 2, 20, 20, 8, cpu) is not other
