"""Hugging Face ``transformers`` models, trained as they are.

A recipe names one like any model by target: the built-in constructors here,
``model: {target: "suite.models.hf:from_config", model_type: llama, hidden_size: 64, ...}`` or
``model: {target: "suite.models.hf:from_pretrained", path: ./my-llama}``, or the user's own
factory returning e.g. ``LlamaForCausalLM(LlamaConfig(...))``. Whatever builds it,
``suite.models.build`` hands a ``PreTrainedModel`` to ``adapt``, which makes the model what every
strategy expects of a language model and changes nothing else (its parameter names stay HF's, so
a checkpoint of the run loads back with ``from_pretrained``, ``suite.export --hf``):

- its forward takes the token ids alone and returns the logits tensor (``.logits`` of HF's
  output), with an attention mask that hides the padding where the config names a
  ``pad_token_id`` (padding lies after each sequence's tokens, and is not scored: its targets are
  ``suite.data.IGNORE``), and without a key-value cache;
- ``units`` (used by FSDP's wrapping and activation checkpointing) are the model's own blocks,
  the classes of its ``_no_split_modules``; ``gradient_checkpointing`` switches on HF's own;
- ``tensor_parallel_plan`` is the plan it publishes (``base_model_tp_plan`` and the head's
  ``_tp_plan``), or the one the recipe gives (``model.tp_plan``).
What transformers keeps private is read through ``suite.compat.transformers``.
"""
from __future__ import annotations

import os
import types

import torch
from torch import nn

from suite.common.errors import SuiteError
from suite.compat import transformers as hf_compat

def from_config(spec, model_type: str = "llama", sequential: bool = False, **config) -> nn.Module:
    """``AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))``; the
    vocabulary defaults to the data's (``spec.num_classes``). ``sequential``: as ``as_sequential``
    lays it out, for the strategies that cut a model between blocks (pipelines)."""
    # optional: transformers is imported only by recipes that name an HF model
    from transformers import AutoConfig, AutoModelForCausalLM

    config.setdefault("vocab_size", spec.num_classes)
    try:
        made = AutoConfig.for_model(model_type, **config)
    except ValueError as e:
        raise SuiteError(f"model.model_type={model_type!r}: {' '.join(str(e).split())[:200]}; "
                         f"name a transformers model type (llama, gpt2, qwen2, ...)") from None
    model = AutoModelForCausalLM.from_config(made, dtype=torch.get_default_dtype())
    return as_sequential(model) if sequential else model


def from_pretrained(spec, path: str, sequential: bool = False, **overrides) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(path)``: a folder written by ``save_pretrained``
    (config.json and safetensors) on this machine; ``overrides`` change its config (e.g.
    ``attention_dropout``). Loaded in the run's precision (float64 under ``fp64``)."""
    # optional: transformers is imported only by recipes that name an HF model
    from transformers import AutoModelForCausalLM

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise SuiteError(f"model.path={path!r} holds no config.json; give a folder written by save_pretrained "
                         f"(or suite.export --hf)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.get_default_dtype(), **overrides)
    return as_sequential(model) if sequential else model


def as_sequential(model: nn.Module) -> nn.Sequential:
    """A decoder laid out as Llama's (Qwen2, Mistral, ...: ``embed_tokens``, ``layers``, ``norm``,
    ``rotary_emb`` under the base model, ``lm_head``) as an ``nn.Sequential`` of its embedding, each
    decoder block and its head, which the pipelines cut between: the same modules and the same
    function, each block making the position embeddings and the causal mask the model's forward
    would hand it (no padding mask: padding lies after the tokens, which a causal model never
    attends to). Parameter names are the Sequential's; the model itself is kept (``hf_model``,
    unregistered) so that ``suite.export --hf`` writes it under HF's names."""
    base = getattr(model, model.base_model_prefix, None)
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    if base is None or not all(hasattr(base, p) for p in parts) or not hasattr(model, "lm_head"):
        raise SuiteError(f"model.sequential=true cuts decoders laid out as Llama's ({', '.join(parts)}, lm_head), "
                         f"and {type(model).__name__} is not; leave it false (ddp, fsdp, zero, tensor take it whole)")
    if model.lm_head.weight is base.embed_tokens.weight:
        raise SuiteError(f"model.sequential=true: {type(model).__name__} ties its input and output embeddings, which "
                         f"the first and last pipeline stages would each hold a copy of; set tie_word_embeddings: false")
    layers = list(base.layers)[:model.config.num_hidden_layers]
    seq = nn.Sequential(_Embed(base.embed_tokens), *(_Decoder(layer, base.rotary_emb) for layer in layers),
                        _Head(base.norm, model.lm_head))
    object.__setattr__(seq, "hf_model", model)  # not a submodule: its parameters are the Sequential's
    return seq


class _Embed(nn.Module):
    def __init__(self, embed):
        super().__init__()
        self.embed = embed

    def forward(self, input_ids):
        return self.embed(input_ids)


class _Decoder(nn.Module):
    def __init__(self, layer, rotary):
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, hidden):
        positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
        return self.layer(hidden, attention_mask=_causal_mask(hidden[..., 0], hidden.dtype), position_ids=positions,
                          position_embeddings=self.rotary(hidden, positions))


class _Head(nn.Module):
    def __init__(self, norm, head):
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, hidden):
        return self.head(self.norm(hidden))


def adapt(model: nn.Module) -> nn.Module:
    """The model with a forward that returns its logits (module doc); in place, on the instance,
    so parameter names, ``isinstance`` and HF's own methods are as they were. A bound method, so
    ``copy.deepcopy`` binds the copy's."""
    model.forward = types.MethodType(_logits_forward, model)
    # Its blocks take masks and rotary embeddings its own forward makes: no cut between top-level
    # blocks carries them (the splitting strategies refuse it with this reason).
    model.not_splittable_because = (f"{type(model).__name__} hands its blocks the masks and position embeddings "
                                    f"its own forward makes, which no cut between top-level blocks carries (a "
                                    f"decoder laid out as Llama's is cut with model.sequential: true)")
    return model


def _logits_forward(self, input_ids, *args, **kwargs):
    pad = self.config.pad_token_id
    mask = None if pad is None else (input_ids != pad).long()
    if input_ids.device.type == "meta":
        # HF tests its masks' values (any padding? packed sequences?), which the meta device (the
        # suite's shape-only build and FLOP count) has none of; a 4-D causal mask it takes as given.
        mask = _causal_mask(input_ids, self.dtype)
    # type(self).forward: the class's own (FSDP2 swaps the class for a subclass of it).
    return type(self).forward(self, input_ids=input_ids, attention_mask=mask, use_cache=False).logits


def _causal_mask(input_ids, dtype) -> torch.Tensor:
    """(batch, 1, length, length): 0 where a token may attend, the dtype's lowest value elsewhere."""
    length = input_ids.shape[-1]
    allowed = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
    mask = torch.zeros(length, length, dtype=dtype, device=input_ids.device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask.expand(input_ids.shape[0], 1, length, length)


def is_hf(model: nn.Module) -> bool:
    return hf_compat.is_model(model)


def units(model: nn.Module) -> list[nn.Module] | None:
    """The model's transformer blocks (instances of its ``_no_split_modules`` classes, in order),
    or None where it is no HF model or declares none: the caller then takes its top-level blocks."""
    if not is_hf(model):
        return None
    names = set(hf_compat.no_split_classes(model))
    found = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    return found or None


def gradient_checkpointing(model: nn.Module) -> bool:
    """Switch on HF's own gradient checkpointing (its blocks recompute in backward); False where
    the model is no HF model or cannot (the caller then checkpoints blocks itself)."""
    if not is_hf(model) or not getattr(model, "supports_gradient_checkpointing", False):
        return False
    hf_compat.enable_gradient_checkpointing(model)
    return True


def tensor_parallel_plan(model: nn.Module, given: dict | None = None) -> dict[str, str]:
    """``{module path: style}``: ``given`` (the recipe's ``model.tp_plan``) or what the model
    publishes; {} where neither. Styles are HF's names (``colwise``, ``rowwise``, ...): the
    tensor strategy maps those a Linear takes (``suite.strategies.tensor.STYLES``) and refuses others."""
    given = given or getattr(model, "suite_tp_plan", None)
    return dict(given) if given else (hf_compat.tensor_parallel_plan(model) if is_hf(model) else {})


def loss_function(model: nn.Module):
    """(the model's own loss as ``fn(logits, targets)`` over next-token targets, its name):
    what its ``.loss`` is when labels are given, fed the suite's already shifted targets."""
    if not is_hf(model):
        raise SuiteError(f"model.loss=model takes a Hugging Face model's own loss, and {type(model).__name__} is "
                         f"none; set model.loss=task")
    fn, name = hf_compat.loss_function(model)
    vocab = model.config.get_text_config().vocab_size

    def loss(logits, targets):
        return fn(logits, None, vocab_size=vocab, shift_labels=targets.contiguous())

    return loss, f"{type(model).__name__}.loss_function ({name}: mean over the batch's scored tokens)"
