"""Published training runs the planner predicts (``compare.py --only published``), each with its
source and what it printed. ``group``: ``dev``, the rows looked at while the GPU time and memory
model was built; ``held-out``, rows chosen before any of them was run through the planner, to
check it on runs it was not built on.

A row: the model (a recipe's ``model`` section), the sequence length, precision, the strategy
section, GPUs, the profile (a preset or a profile file), the global batch, ``accumulation`` (passes
per step, default 1) and checkpointing; and
what was published: ``tokens_per_s_per_gpu`` (or ``tflops_per_gpu`` with the FLOPs per token the
source counts, converted to tokens), ``memory_gib`` (peak per GPU, with ``memory_kind``: what the
source's figure counts, ``reserved`` by PyTorch's caching allocator, as torchtitan logs
``torch.cuda.max_memory_reserved``, or ``allocated``), ``states_gb`` (ZeRO's model
states per GPU: parameters, gradients, optimizer state).
"""
from __future__ import annotations

from pathlib import Path

PROFILES = Path(__file__).resolve().parent / "profiles"
TORCHTITAN_H100 = str(PROFILES / "h100_96gb_500w.json")  # its published hardware, written as a profile file


def megatron_flops_per_token(layers: int, dim: int, seq: int, vocab: int) -> float:
    """Narayanan et al. 2021 (arXiv 2104.04473), eq. 3 per token: 96 l h^2 (1 + s / 6h + V / 16 l h),
    the FLOPs a step of GPT with full activation recomputation does (the figure its TFLOP/s count)."""
    return 96 * layers * dim**2 * (1 + seq / (6 * dim) + vocab / (16 * layers * dim))


def _megatron(name, dim, heads, layers, tp, gpus, batch, tflops):
    # Megatron-LM of 2021 ran attention unfused (its scores written out, before flash attention):
    # attention "math". These rows were first held out; they became dev rows when, after seeing
    # their error, the model gained its attention kernel option.
    return {"group": "dev", "name": f"Megatron-LM GPT {name}, TP {tp}, DP {gpus // tp}",
            "model": {"name": "transformer", "dim": dim, "heads": heads, "layers": layers, "attention": "math"},
            "vocab": 51200, "seq": 2048, "precision": "bf16",
            "strategy": {"name": "tensor", "dp": gpus // tp} if tp > 1 else {"name": "ddp"},
            "gpus": gpus, "hardware": "a100", "batch": batch, "checkpointing": True,
            "tokens_per_s_per_gpu": tflops * 1e12 / megatron_flops_per_token(layers, dim, 2048, 51200),
            "published": f"{tflops} TFLOP/s per GPU",
            "source": "Narayanan et al. 2021, arXiv 2104.04473, Table 1 (A100 80 GB, fp16; eq. 3 FLOPs)",
            "notes": "Megatron's DP all-reduces (here: FSDP2 over dp beside TP, DDP alone); fp16 planned as bf16; "
                     "its micro-batch is not published: the whole local batch as one"}


# MPT (llm-foundry) sizes: d_model, heads, layers; vocabulary 50,368, GELU MLP of 4 x d_model,
# learned positions, flash attention (scripts/train/yamls/pretrain/mpt-*.yaml).
MPT = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
       "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 56, 48)}
FOUNDRY = "MosaicML llm-foundry, scripts/train/benchmarking/README.md"


def _mpt(size, gpu, micro, accumulation, checkpointing, tokens_per_s_per_gpu, seq=2048, gpus=8):
    dim, heads, layers = MPT[size]
    table = {"a100": "A100 80GB table", "h100": "H100 80GB BF16 table"}[gpu]
    return {"group": "held-out", "name": f"MPT {size}, FSDP, {gpus} {gpu.upper()}, seq {seq}",
            "model": {"name": "transformer", "dim": dim, "heads": heads, "layers": layers},
            "vocab": 50368, "seq": seq, "precision": "bf16", "strategy": {"name": "fsdp", "mixed_precision": "bf16"},
            "gpus": gpus, "hardware": gpu, "batch": micro * accumulation * gpus, "accumulation": accumulation,
            "checkpointing": checkpointing, "tokens_per_s_per_gpu": tokens_per_s_per_gpu,
            "published": f"{tokens_per_s_per_gpu:,} tok/s/GPU (micro-batch {micro})", "source": f"{FOUNDRY}, {table}",
            "notes": "MPT has no biases and ALiBi-free learned positions here; planned as the built-in GPT transformer"}


LLAMA3_8B = {"name": "llama", "preset": "llama3_8b"}
LLAMA3_70B = {"name": "llama", "preset": "llama3_70b"}
TORCHTITAN = "Liang et al., arXiv 2410.06511 (torchtitan), docs/performance.md"
GPT_7_5B = {"name": "transformer", "dim": 4096, "heads": 32, "layers": 36}
ZERO_FIG1 = "Rajbhandari et al., arXiv 1910.02054 (ZeRO), Figure 1"

ROWS = [
    # ---- development rows: looked at while building ----
    {"group": "dev", "name": "torchtitan Llama 3.1 8B, FSDP, 8 H100 (96 GB, 500 W)", "model": LLAMA3_8B,
     "vocab": 128256, "seq": 8192, "precision": "bf16", "strategy": {"name": "fsdp", "mixed_precision": "bf16"},
     "gpus": 8, "hardware": TORCHTITAN_H100, "batch": 16, "checkpointing": "selective",
     "tokens_per_s_per_gpu": 5762, "memory_gib": 82.4, "memory_kind": "reserved", "published": "5,762 tok/s/GPU, 82.4 GiB",
     "source": f"{TORCHTITAN}, Table 1 (FSDP, no compile)"},
    {"group": "dev", "name": "torchtitan Llama 3 8B, FSDP, 64 A100, selective op AC", "model": LLAMA3_8B,
     "vocab": 128256, "seq": 8192, "precision": "bf16", "strategy": {"name": "fsdp", "mixed_precision": "bf16"},
     "gpus": 64, "hardware": "a100", "batch": 64, "checkpointing": "selective",
     "tokens_per_s_per_gpu": 2973, "published": "2,973 WPS, MFU 58.2 %", "source": f"{TORCHTITAN}, 64 A100 table"},
    {"group": "dev", "name": "torchtitan Llama 3 70B, FSDP, 64 A100, full AC", "model": LLAMA3_70B,
     "vocab": 128256, "seq": 8192, "precision": "bf16", "strategy": {"name": "fsdp", "mixed_precision": "bf16"},
     "gpus": 64, "hardware": "a100", "batch": 64, "checkpointing": True,
     "tokens_per_s_per_gpu": 331, "published": "331 WPS, MFU 51.7 %", "source": f"{TORCHTITAN}, 64 A100 table"},
    *[{"group": "dev", "name": f"ZeRO Fig. 1, GPT 7.5B, {label}, 64 GPUs", "model": GPT_7_5B, "vocab": 50304,
       "seq": 1024, "precision": "bf16", "strategy": strategy, "gpus": 64, "hardware": "a100", "batch": 64,
       "checkpointing": False, "states_gb": gb, "published": f"{gb} GB of model states", "source": ZERO_FIG1}
      for label, strategy, gb in (("DP", {"name": "ddp"}, 120.0), ("ZeRO-1", {"name": "zero", "stage": 1}, 31.4),
                                  ("ZeRO-2", {"name": "zero", "stage": 2}, 16.6),
                                  ("ZeRO-3", {"name": "zero", "stage": 3}, 1.88))],
    # Megatron-LM's Table 1, the rows without pipeline parallelism (A100 80 GB, DGX SuperPOD).
    _megatron("1.7B", 2304, 24, 24, 1, 32, 512, 137),
    _megatron("3.6B", 3072, 32, 30, 2, 64, 512, 138),
    _megatron("7.5B", 4096, 32, 36, 4, 128, 512, 142),
    _megatron("18.4B", 6144, 48, 40, 8, 256, 1024, 135),
    # ---- held-out rows: chosen by a rule fixed before any was run through the planner ----
    # llm-foundry's benchmark tables, every row on 8 GPUs at sequence 2048 of the A100 80GB and the
    # H100 80GB BF16 tables (FSDP FULL_SHARD, amp_bf16; the first of two rows of one size).
    _mpt("30b", "a100", 3, 21, True, 916), _mpt("13b", "a100", 2, 3, False, 2262),
    _mpt("7b", "a100", 6, 2, False, 4641), _mpt("3b", "a100", 10, 2, False, 10811),
    _mpt("1b", "a100", 14, 4, False, 20513), _mpt("760m", "a100", 24, 2, False, 32434),
    _mpt("350m", "a100", 32, 2, False, 58782), _mpt("125m", "a100", 40, 2, False, 142830),
    _mpt("30b", "h100", 3, 21, True, 2002), _mpt("13b", "h100", 2, 1, False, 4792),
    _mpt("7b", "h100", 6, 1, False, 10643), _mpt("1b", "h100", 14, 1, False, 45455),
    _mpt("760m", "h100", 24, 2, False, 63147),
]
