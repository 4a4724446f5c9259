"""Causal self-attention as the built-in language models compute it, by one of two kernels.

``fused`` (the default): ``scaled_dot_product_attention``, which picks flash / memory-efficient
kernels on a GPU: the length x length scores never reach memory.
``math``: the eager formulation, written out: scores = q kᵀ / sqrt(d), the future masked, softmax,
times v. This is how GPT implementations ran before fused kernels (Megatron-LM 2021, nanoGPT
without flash, Hugging Face's ``attn_implementation="eager"``): each score matrix is written,
read and written again, and kept for the backward pass, which costs a GPU memory bandwidth and
memory that the fused kernel does not. The planner counts whichever the model runs, so choosing
``math`` is how a plan matches a run made that way.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

Kernel = Literal["fused", "math"]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: Kernel = "fused") -> torch.Tensor:
    """Causal attention of (batch, heads, length, head_dim) queries over keys and values with as
    many or fewer heads (grouped-query attention: each key/value head serves its group)."""
    grouped = k.shape[1] != q.shape[1]
    if kernel == "fused":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
    if grouped:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    length, keys = q.shape[-2], k.shape[-2]
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
    future = torch.ones(length, keys, dtype=torch.bool, device=q.device).triu(keys - length + 1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1) @ v
