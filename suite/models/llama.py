"""A Llama-family decoder-only language model: RMSNorm (pre-norm), SwiGLU feed-forward,
grouped-query attention with rotary positions, an untied (or tied) output head; no biases.

Sized by options, or by a named published configuration (``model.preset``: ``llama3_8b``,
``llama3_70b``, ``llama3_405b``, GPT-3's sizes; ``llama_presets.py``), whose values any option
given beside it overrides. ``nn.Sequential(Embedding, Block x layers, Head)`` like the suite's
transformer, so pipelines cut between blocks, FSDP shards block by block and checkpointing wraps
each block; the layer names follow torchtitan's (``attention.wq/wk/wv/wo``,
``feed_forward.w1/w2/w3``), and its tensor-parallel layout is torchtitan's
(``suite/strategies/tensor.py``). Attention infers the number of heads from the projected width,
so a column-wise split leaves each rank its own whole query and key/value heads.
Rotary angles are computed in each forward from the positions (no buffer: nothing to initialise
on the meta device, nothing in the state dict), in at least float32, as torchtitan does.
FLOPs are counted as torchtitan and PaLM count them for MFU (``flops_per_token``).
No dropout: runs stay deterministic, which the parity checks rely on.
"""
from __future__ import annotations

import math
from typing import ClassVar, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import PositiveFloat, PositiveInt, model_validator
from torch import nn

from suite.common.errors import SuiteError
from suite.models.attention import Kernel, attend
from suite.models.base import ModelOptions
from suite.models.llama_presets import PRESETS


class Llama(ModelOptions):
    name: Literal["llama"] = "llama"
    inputs: ClassVar = "tokens"
    task = "language"
    preset: Optional[Literal[tuple(PRESETS)]] = None  # a published size; options given beside it win
    vocab: Optional[PositiveInt] = None  # default: the preset's, else the data's
    dim: PositiveInt = 64
    layers: PositiveInt = 2
    heads: PositiveInt = 4
    kv_heads: Optional[PositiveInt] = None  # key/value heads (grouped-query attention); default: heads
    # Feed-forward width; default as Llama computes it: 8/3 x dim, times ffn_dim_multiplier,
    # rounded up to a multiple of multiple_of.
    ffn_dim: Optional[PositiveInt] = None
    ffn_dim_multiplier: Optional[PositiveFloat] = None
    multiple_of: PositiveInt = 256
    norm_eps: PositiveFloat = 1e-5
    rope_theta: PositiveFloat = 10000.0
    tie_embeddings: bool = False  # the output head reuses the token embedding's weights
    attention: Kernel = "fused"  # or "math": scores written out, as before fused kernels (models/attention.py)

    @model_validator(mode="before")
    @classmethod
    def _preset_under_options(cls, data):
        if isinstance(data, dict) and data.get("preset") in PRESETS:
            return {**PRESETS[data["preset"]], **data}
        return data

    @model_validator(mode="after")
    def _shapes_divide(self):
        kv_heads = self.kv_heads or self.heads
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise SuiteError(f"model.dim={self.dim} must be model.heads={self.heads} times an even head size "
                             f"(rotary positions turn pairs of features); choose heads dividing dim/2")
        if self.heads % kv_heads:
            raise SuiteError(f"model.kv_heads={kv_heads} must divide model.heads={self.heads} (each key/value head "
                             f"serves a whole group of query heads); choose a divisor of {self.heads}")
        return self

    def hidden_dim(self) -> int:
        return feed_forward_dim(self.dim, self.ffn_dim, self.ffn_dim_multiplier, self.multiple_of)

    def flops_per_token(self, model: nn.Module, seq_len: int) -> int:
        """Training FLOPs per token as torchtitan's ``get_num_flop_per_token`` and PaLM's appendix B
        count them: 6 x N + 12 x layers x heads x head_dim x seq_len, N the parameters but the
        token embedding (a lookup, no multiply), the output head counted even when tied (it is a
        matmul), the attention term for full (not causal) score matrices."""
        n = sum(p.numel() for p in model.parameters()) - model[0].tokens.weight.numel()
        if self.tie_embeddings:
            n += model[-1].output.weight.numel()
        return 6 * n + 12 * self.layers * self.dim * seq_len


OPTIONS = [Llama]


def feed_forward_dim(dim: int, ffn_dim: int | None, multiplier: float | None, multiple_of: int) -> int:
    """Llama's rule (torchtitan's ``FeedForward``): int(2/3 x 4 x dim), times the multiplier,
    rounded up to ``multiple_of``; an explicit ``ffn_dim`` wins."""
    if ffn_dim:
        return ffn_dim
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * math.ceil(hidden / multiple_of)


class Embedding(nn.Module):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)

    def forward(self, tokens):
        return self.tokens(tokens)


def rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary positions on (batch, heads, length, head_dim): feature pairs (i, i + head_dim/2)
    turned by position x theta^(-2i/head_dim) (the rotate-half form)."""
    length, head_dim = x.shape[-2], x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=x.device, dtype=dtype) / head_dim)
    angles = torch.outer(torch.arange(length, device=x.device, dtype=dtype), inv_freq)
    cos, sin = angles.cos(), angles.sin()
    first, second = x.to(dtype).chunk(2, dim=-1)
    turned = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    return turned.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, rope_theta: float, kernel: Kernel = "fused"):
        super().__init__()
        self.head_dim, self.rope_theta, self.kernel = dim // heads, rope_theta, kernel
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x):
        batch, length, _ = x.shape
        # -1 heads: the full count on one rank, the local share under tensor parallelism.
        q, k, v = (p(x).view(batch, length, -1, self.head_dim).transpose(1, 2) for p in (self.wq, self.wk, self.wv))
        q, k = rotate(q, self.rope_theta), rotate(k, self.rope_theta)
        y = attend(q, k, v, self.kernel)  # grouped heads served without copies under the fused kernel
        return self.wo(y.transpose(1, 2).reshape(batch, length, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, norm_eps: float, rope_theta: float,
                 kernel: Kernel = "fused"):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim, eps=norm_eps)
        self.attention = Attention(dim, heads, kv_heads, rope_theta, kernel)
        self.ffn_norm = nn.RMSNorm(dim, eps=norm_eps)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Head(nn.Module):
    def __init__(self, dim: int, vocab: int, norm_eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=norm_eps)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        return self.output(self.norm(x))


def build(spec, *, preset: str | None, vocab: int | None, dim: int, layers: int, heads: int, kv_heads: int | None,
          ffn_dim: int | None, ffn_dim_multiplier: float | None, multiple_of: int, norm_eps: float,
          rope_theta: float, tie_embeddings: bool, attention: Kernel = "fused") -> nn.Sequential:
    del preset  # its values are already the options'
    vocab = vocab or spec.num_classes
    if vocab < spec.num_classes:
        raise SuiteError(f"model.vocab={vocab} must be at least the data's {spec.num_classes} token ids; "
                         f"leave it unset to take the data's")
    hidden = feed_forward_dim(dim, ffn_dim, ffn_dim_multiplier, multiple_of)
    blocks = [Block(dim, heads, kv_heads or heads, hidden, norm_eps, rope_theta, attention) for _ in range(layers)]
    embedding, head = Embedding(vocab, dim), Head(dim, vocab, norm_eps)
    if tie_embeddings:
        head.output.weight = embedding.tokens.weight
    return nn.Sequential(embedding, *blocks, head)
