"""rtcnorm.patch on tiny Hugging Face models built from their config classes (CPU, fp32).

No weights are downloaded: every model is random-initialised from a config of
hidden size 64, 2 layers and a 128-token vocabulary. Norm weights are redrawn
so a wrong scale (``weight`` vs ``1 + weight``) cannot hide behind HF's
ones/zeros initialisation.
"""

from __future__ import annotations

import copy

import pytest
import rtcnorm
import torch
from rtcnorm.patch import is_patched

transformers = pytest.importorskip("transformers")

_DECODER = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=0,
    eos_token_id=1,
)
_DEEPSEEK = dict(
    _DECODER,
    num_key_value_heads=4,
    moe_intermediate_size=32,
    n_shared_experts=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
)

# family: (config class, model class, config kwargs, expected swap label)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", _DECODER, "rms_norm"),
    "mistral": ("MistralConfig", "MistralForCausalLM", _DECODER, "rms_norm"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _DECODER, "rms_norm"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(_DECODER, head_dim=16), "rms_norm"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(_DECODER, head_dim=16), "rms_norm (1 + weight)"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(_DECODER, head_dim=16), "rms_norm (1 + weight)"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(_DECODER, head_dim=16), "rms_norm (1 + weight)"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", _DECODER, "rms_norm"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", _DECODER, "rms_norm"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK, "rms_norm"),
    "granite": ("GraniteConfig", "GraniteForCausalLM", _DECODER, "rms_norm"),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=128, bos_token_id=0, eos_token_id=1),
        "layer_norm",
    ),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", _DECODER, "layer_norm"),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(_DECODER, num_kv_heads=2), "layer_norm"),
    "bert": ("BertConfig", "BertForMaskedLM", _DECODER, "layer_norm"),
}


def build(family: str, dtype=torch.float32):
    cfg_name, model_name, kwargs, _ = FAMILIES[family]
    cfg_cls = getattr(transformers, cfg_name, None)
    model_cls = getattr(transformers, model_name, None)
    if cfg_cls is None or model_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name} / {model_name}")
    cfg = cfg_cls(**{k: v for k, v in kwargs.items() if k != "num_key_value_heads" or family != "falcon"})
    cfg._attn_implementation = "eager"
    model = model_cls(cfg).to(dtype).eval()
    with torch.no_grad():
        for m in model.modules():
            if "Norm" in type(m).__name__:
                for p in m.parameters(recurse=False):
                    p.add_(0.3 * torch.randn_like(p))
    return model


def norm_names(model) -> set[str]:
    return {n for n, m in model.named_modules() if "Norm" in type(m).__name__ and not list(m.children())}


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    proj = torch.randn(logits.shape, generator=torch.Generator().manual_seed(5), dtype=logits.dtype)
    (logits * proj).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def rel_err(a, b) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_patch_matches_logits_and_grads(family):
    model = build(family)
    ref = copy.deepcopy(model)
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    keys = list(model.state_dict())
    summary = rtcnorm.patch(model)
    assert summary.skipped == [], str(summary)
    assert {s.name for s in summary.swapped} == norm_names(ref), str(summary)
    assert {s.kind for s in summary.swapped} == {FAMILIES[family][3]}
    if family in ("qwen3", "gemma3", "olmo2"):
        assert any(s.name.endswith("q_norm") for s in summary.swapped)
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == ptrs
    assert list(model.state_dict()) == keys
    ids = torch.randint(0, 128, (2, 12))
    y, g = loss_and_grads(model, ids)
    y_ref, g_ref = loss_and_grads(ref, ids)
    assert rel_err(y, y_ref) < 1e-4
    assert g.keys() == g_ref.keys()
    # Relative to each gradient's size, or to a thousandth of the largest one
    # for those that vanish analytically (e.g. BERT's key bias).
    floor = 1e-3 * max(float(t.abs().max()) for t in g_ref.values())
    for name in g:
        err = float((g[name] - g_ref[name]).abs().max())
        assert err <= 2e-4 * max(float(g_ref[name].abs().max()), floor), name


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "gpt2"])
def test_family_low_precision_is_verified(family):
    # bf16: HF's casting orders (Llama rounds before the weight multiply,
    # Gemma after) both stay within bf16's tolerance of rtcnorm's one rounding.
    model = build(family, torch.bfloat16)
    summary = rtcnorm.patch(model)
    assert summary.skipped == [] and len(summary.swapped) == len(norm_names(model))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_save_pretrained_round_trip(family, tmp_path):
    model = build(family)
    rtcnorm.patch(model)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    sd, sd_loaded = model.state_dict(), loaded.state_dict()
    assert sd.keys() == sd_loaded.keys()
    for k in sd:
        assert torch.equal(sd[k], sd_loaded[k]), k
    ids = torch.randint(0, 128, (1, 10))
    summary = rtcnorm.patch(loaded)
    assert len(summary.swapped) == len(norm_names(loaded))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_state_dict_round_trip_between_patched_and_plain():
    model = build("qwen3")
    plain = copy.deepcopy(model)
    rtcnorm.patch(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    plain.load_state_dict(model.state_dict())
    ids = torch.randint(0, 128, (2, 8))
    with torch.no_grad():
        assert rel_err(model(input_ids=ids).logits, plain(input_ids=ids).logits) < 1e-4


def test_unpatch_and_patch_twice():
    model = build("gemma3")
    classes = {n: type(m) for n, m in model.named_modules()}
    first = rtcnorm.patch(model)
    second = rtcnorm.patch(model)
    assert second.swapped == [] and second.skipped == []
    assert sorted(second.already) == sorted(s.name for s in first.swapped)
    assert sorted(rtcnorm.unpatch(model)) == sorted(s.name for s in first.swapped)
    assert {n: type(m) for n, m in model.named_modules()} == classes
    assert rtcnorm.unpatch(model) == []


def test_patched_context_restores_only_its_own_swaps():
    model = build("gpt2")
    names = {s.name for s in rtcnorm.patch(model.transformer.h[0]).swapped}
    with rtcnorm.patched(model) as summary:
        assert {s.name for s in summary.swapped}.isdisjoint(names) and summary.swapped
        assert all(is_patched(m) for m in model.modules() if type(m).__name__ == "LayerNorm")
    assert is_patched(model.transformer.h[0].ln_1)
    assert not is_patched(model.transformer.ln_f)


def test_compile_fullgraph_decoder_layer_has_no_graph_break():
    model = build("qwen3")
    rtcnorm.patch(model)
    layer = model.model.layers[0]
    hidden = torch.randn(2, 8, 64, requires_grad=True)
    pos = torch.arange(8)[None].expand(2, -1)
    cos_sin = model.model.rotary_emb(hidden, pos)
    eager = layer(hidden, position_embeddings=cos_sin, attention_mask=None)
    eager = eager[0] if isinstance(eager, tuple) else eager
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out = compiled(hidden, position_embeddings=cos_sin, attention_mask=None)
    out = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(out, eager)
    out.sum().backward()
    assert layer.self_attn.q_norm.weight.grad is not None
    explain = torch._dynamo.explain(layer)(hidden, position_embeddings=cos_sin, attention_mask=None)
    assert explain.graph_break_count == 0 and explain.graph_count == 1


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3", "olmo2", "gpt2", "bert"])
def test_family_on_gpu_bf16(family):
    # Verification runs on the GPU kernels; the patched model's logits are
    # within bf16 tolerance of the unpatched one's, eager and (two families,
    # to bound the compile time) under torch.compile(fullgraph=True).
    model = build(family, torch.bfloat16).cuda()
    ref = copy.deepcopy(model)
    summary = rtcnorm.patch(model)
    assert summary.skipped == [] and len(summary.swapped) == len(norm_names(ref)), str(summary)
    ids = torch.randint(0, 128, (2, 64), device="cuda")
    with torch.no_grad():
        y, y_ref = model(input_ids=ids).logits, ref(input_ids=ids).logits
    assert rel_err(y, y_ref) < 5e-2
    if family not in ("qwen3", "gemma3"):
        return
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        assert rel_err(compiled(input_ids=ids).logits, y_ref) < 5e-2
