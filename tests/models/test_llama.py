"""The Llama model: published presets' sizes (on the meta device, nothing allocated), its FLOPs as
torchtitan and PaLM count them, its attention (causal, rotary, grouped), selective checkpointing,
and the tiny recipe end to end."""
import json
import subprocess
import sys
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode  # a test's probe; no suite code uses it

from suite import recipe as recipes
from suite.common.errors import SuiteError
from suite.data import DataSpec
from suite.models import MODELS, build, flops
from suite.models.empty import on_meta
from suite.models.llama import rotate
from suite.strategies import prepare

Llama = MODELS["llama"][0]


def meta_model(options: dict, seq_len: int = 2048):
    opts = Llama(**options)
    model = on_meta(lambda: build(opts, DataSpec("tokens", (seq_len,), opts.vocab or 32, "int64", seq_len)))
    assert all(p.is_meta for p in model.parameters())  # shapes only: 405B parameters cost nothing here
    return opts, model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("preset, published", [
    ("llama3_8b", 8.03e9), ("llama3_70b", 70.6e9), ("llama3_405b", 405.9e9),  # Meta's model cards
])
def test_llama3_presets_have_the_published_parameter_counts(preset, published):
    _, model = meta_model({"preset": preset})
    assert abs(n_params(model) - published) / published < 0.002


def test_llama3_8b_by_hand():
    """dim 4096, 32 layers, 32 heads of 128, 8 kv heads, FFN 14336, vocab 128256, untied."""
    opts, model = meta_model({"preset": "llama3_8b"})
    attention = 4096 * 4096 * 2 + 4096 * 1024 * 2  # wq, wo; wk, wv (8 heads x 128)
    layer = attention + 3 * 4096 * 14336 + 2 * 4096  # w1, w2, w3; two RMSNorms
    assert n_params(model) == 32 * layer + 2 * 128256 * 4096 + 4096 == 8_030_261_248
    assert (opts.rope_theta, opts.kv_heads, opts.tie_embeddings) == (500000.0, 8, False)


@pytest.mark.parametrize("preset, published", [
    ("gpt3_125m", 125e6), ("gpt3_350m", 350e6), ("gpt3_760m", 760e6), ("gpt3_1_3b", 1.3e9), ("gpt3_2_7b", 2.7e9),
    ("gpt3_6_7b", 6.7e9), ("gpt3_13b", 13e9), ("gpt3_175b", 175e9),  # GPT-3 paper, Table 2.1
])
def test_gpt3_presets_have_the_papers_sizes(preset, published):
    _, model = meta_model({"preset": preset})
    assert abs(n_params(model) - published) / published < 0.05


def test_options_given_beside_a_preset_win():
    opts = Llama(preset="llama3_70b", layers=2)
    assert (opts.dim, opts.layers, opts.heads, opts.kv_heads, opts.ffn_dim) == (8192, 2, 64, 8, 28672)


def test_the_feed_forward_width_follows_llamas_rule():
    # 8B's 14336 from its multiplier 1.3 and multiple_of 1024, as Meta's params.json gives them
    assert Llama(dim=4096, ffn_dim_multiplier=1.3, multiple_of=1024).hidden_dim() == 14336
    assert Llama(dim=768).hidden_dim() == 2048  # 8/3 x 768, already a multiple of 256


@pytest.mark.parametrize("options, key", [({"heads": 4, "kv_heads": 3}, "model.kv_heads=3"),
                                          ({"dim": 20, "heads": 4}, "model.dim=20"),
                                          ({"preset": "llama4"}, "preset")])
def test_bad_shapes_are_one_line(options, key):
    with pytest.raises((SuiteError, ValueError)) as err:
        recipes.validate({"name": "t", "model": {"name": "llama", **options}, "data": {"name": "synthetic_tokens"}, "strategy": {"name": "single"}})
    assert key in str(err.value) and "\n" not in str(err.value), err.value


def test_flops_per_token_is_torchtitans_formula_by_hand():
    """torchtitan's get_num_flop_per_token: 6 x (parameters - embedding) + 12 x l x h x d_head x seq."""
    opts, model = meta_model({"preset": "llama3_8b"}, seq_len=8192)
    non_embedding = 8_030_261_248 - 128256 * 4096
    assert opts.flops_per_token(model, 8192) == 6 * non_embedding + 12 * 32 * 32 * 128 * 8192 == 57_914_449_920


def test_a_step_counts_the_formula_over_its_tokens_and_the_counter_agrees():
    """The recipe's step FLOPs are the formula's; running the model under torch's FLOP counter
    gives the same but for the norms' weights, which multiply no matrix (6 x their count per token)."""
    raw = {"name": "t", "model": {"name": "llama", "dim": 64, "layers": 3, "heads": 4, "kv_heads": 2},
           "data": {"name": "synthetic_tokens", "vocab": 128, "seq_len": 32}, "strategy": {"name": "single"}, "training": {"batch_size": 8}}
    recipe = recipes.validate(raw)
    tokens = 8 * 32
    opts, model = meta_model({**raw["model"], "vocab": 128}, seq_len=32)
    counted = flops.train_step_flops(recipe)
    assert counted == opts.flops_per_token(model, 32) * tokens
    norms = (2 * 3 + 1) * 64
    with torch.device("meta"):
        counter = torch.utils.flop_counter.FlopCounterMode(display=False)
        with counter:
            model(torch.zeros(8, 32, dtype=torch.int64)).float().sum().backward()
    assert counted - counter.get_total_flops() == 6 * norms * tokens


def test_attention_is_causal_and_rotary_positions_are_relative():
    torch.manual_seed(0)
    model = build(Llama(dim=32, heads=4, kv_heads=2), DataSpec("tokens", (12,), 16, "int64", 12))
    tokens = torch.randint(0, 16, (2, 12))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 16
    assert torch.allclose(model(tokens)[:, :8], model(changed)[:, :8])  # no position sees a later one
    assert not torch.allclose(model(tokens)[:, 8:], model(changed)[:, 8:])
    q, k = torch.randn(1, 1, 6, 8, dtype=torch.float64), torch.randn(1, 1, 6, 8, dtype=torch.float64)
    q, k = q[:, :, :1].expand(-1, -1, 6, -1), k[:, :, :1].expand(-1, -1, 6, -1)  # same vectors at every position
    scores = rotate(q, 10000.0)[0, 0] @ rotate(k, 10000.0)[0, 0].T
    assert torch.allclose(scores[1, 0], scores[5, 4]) and torch.allclose(scores[3, 1], scores[4, 2])
    assert not torch.allclose(scores[1, 0], scores[2, 0])


class _Matmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = Counter()

    def __torch_dispatch__(self, op, types, args=(), kwargs=None):
        self.count[op] += 1
        return op(*args, **(kwargs or {}))


@pytest.mark.parametrize("checkpointing", [False, "selective", True])
def test_selective_checkpointing_recomputes_half_the_matmuls_and_no_attention(checkpointing):
    torch.manual_seed(0)
    model = build(Llama(dim=32, heads=4, kv_heads=2, layers=2), DataSpec("tokens", (8,), 16, "int64", 8))
    prepare.prepare(model, activation_checkpointing=checkpointing, compile=False, device=torch.device("cpu"))
    with _Matmuls() as calls:
        model(torch.randint(0, 16, (2, 8))).sum().backward()
    mm, sdpa = torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    block_mm = 2 * 7  # 7 linear layers per block, 2 blocks
    plain = 3 * (block_mm + 1)  # forward and two backward matmuls each, the head's too
    # Full: every matmul of a block but its last, w2, whose output backward never needs (the
    # recomputation stops early); selective keeps the odd-numbered ones (wq, wv, w1, w2).
    recomputed = {False: 0, "selective": 2 * 3, True: 2 * 6}[checkpointing]
    assert calls.count[mm] == plain + recomputed
    assert calls.count[sdpa] == 2 + (2 if checkpointing is True else 0)


@pytest.mark.slow
def test_the_tiny_recipe_runs_end_to_end(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "suite.submit", "recipes/llama_tiny.yaml", "--out", str(tmp_path),
                           "training.epochs=1", "tracking.wandb=disabled"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and (summary["strategy"], summary["world_size"]) == ("fsdp", 2)
    assert summary["tokens_per_s"] > 0 and summary["final"]["val_loss"] < 4.1  # log(64) = 4.16 at chance
