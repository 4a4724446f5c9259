"""Named sizes for ``model.name: llama`` (``model.preset``), as published.

Llama 3: the configurations Meta released (``params.json`` of Llama-3/3.1 8B, 70B, 405B), as
torchtitan's ``llama3`` model registry also lists them: dimension, layers, heads, key/value heads
(grouped-query attention), the feed-forward width that ``ffn_dim_multiplier`` and ``multiple_of``
give (14336, 28672, 53248), a 128,256-token vocabulary, rotary base 500,000, RMSNorm eps 1e-5,
untied output head.

GPT-3: the eight sizes of the GPT-3 paper's Table 2.1 (Brown et al. 2020, "Language Models are
Few-Shot Learners"): layers, d_model, heads; vocabulary 50,257 (GPT-2's BPE), tied input and
output embeddings. Built here with this model's blocks (SwiGLU, RMSNorm, rotary positions), whose
feed-forward width 8/3 x d_model (rounded up to a multiple of 256) keeps 12 d_model^2 parameters
per layer as GPT-3's 4 x d_model GELU MLP has: the parameter counts stay the paper's names
(GPT-3's learned positions, 2,048 x d_model, are not here).
"""
from __future__ import annotations

_LLAMA3 = {"vocab": 128256, "rope_theta": 500000.0, "norm_eps": 1e-5, "tie_embeddings": False}
_GPT3 = {"vocab": 50257, "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": True}

PRESETS: dict[str, dict] = {
    # Llama 3 / 3.1 (Meta's released params.json; torchtitan's llama3 registry)
    "llama3_8b": {**_LLAMA3, "dim": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "ffn_dim": 14336},
    "llama3_70b": {**_LLAMA3, "dim": 8192, "layers": 80, "heads": 64, "kv_heads": 8, "ffn_dim": 28672},
    "llama3_405b": {**_LLAMA3, "dim": 16384, "layers": 126, "heads": 128, "kv_heads": 8, "ffn_dim": 53248},
    # GPT-3 paper, Table 2.1 (n_layers, d_model, n_heads; d_head = d_model / n_heads)
    "gpt3_125m": {**_GPT3, "dim": 768, "layers": 12, "heads": 12},  # GPT-3 Small
    "gpt3_350m": {**_GPT3, "dim": 1024, "layers": 24, "heads": 16},  # GPT-3 Medium
    "gpt3_760m": {**_GPT3, "dim": 1536, "layers": 24, "heads": 16},  # GPT-3 Large
    # GPT-3 XL: the table prints 24 heads of d_head 128, which is 3072, not d_model 2048; kept here are
    # d_model (it sets the parameters) and d_head 128: 16 heads.
    "gpt3_1_3b": {**_GPT3, "dim": 2048, "layers": 24, "heads": 16},
    "gpt3_2_7b": {**_GPT3, "dim": 2560, "layers": 32, "heads": 32},  # GPT-3 2.7B (d_head 80)
    "gpt3_6_7b": {**_GPT3, "dim": 4096, "layers": 32, "heads": 32},  # GPT-3 6.7B (d_head 128)
    # GPT-3 13B: the table prints d_model 5140 with 40 heads of 128; 40 x 128 = 5120, which is used here.
    "gpt3_13b": {**_GPT3, "dim": 5120, "layers": 40, "heads": 40},
    "gpt3_175b": {**_GPT3, "dim": 12288, "layers": 96, "heads": 96},  # GPT-3 175B (d_head 128)
}
