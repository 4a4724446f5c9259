"""training.precision=fp16: loss scaling (suite.strategies.scaling) on CPU, where torch's fp16
autocast and GradScaler run too. fp16 cannot match the float64 baseline, so these tests check
the mechanics: the loss is scaled, a step whose gradients hold an inf is skipped on EVERY rank
(parameters unchanged, scale halved) and recorded, the next step trains, and a clip sees the
unscaled gradients. The inf is put in where it would arise: in one rank's gradients before the
reduction (replicas), or in one rank's shard after it (fsdp, fsdp1), where only a scaler that
agrees over the ranks keeps them equal."""
import math

import pytest
import torch
import torch.distributed as dist

from suite import strategies
from suite.common.errors import SuiteError
from suite.record.run_record import read_json, read_metrics
from suite.strategies.context import DistContext
from suite.train.rank import make_setup
from tests.harness import run_ranks
from tests.parity import BASE, make_recipe, step_losses

pytestmark = pytest.mark.slow  # starts ranks or fake runs: not in the fast tier

WORLD = 2
CPU = torch.device("cpu")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _poison_leaf_gradient(engine) -> None:
    """Rank 1's first parameter gets an inf in its gradient as backward computes it, before any
    reduction (an overflow in that rank's backward)."""
    first = next(p for p in engine.parameters() if p.requires_grad)
    handle = first.register_hook(lambda g: g * math.inf)
    engine._remove_poison = handle.remove


def _poison_shard_after_reduction(engine) -> None:
    """Rank 1's own gradient shard gets an inf after the reduction: rank 0's shards stay finite."""
    reduce = engine.reduce_gradients

    def poisoned():
        reduce()
        grad = next(_local(p.grad) for p in engine.parameters() if p.grad is not None and _local(p.grad).numel())
        grad.view(-1)[0] = math.inf
    engine.reduce_gradients = poisoned
    engine._remove_poison = lambda: setattr(engine, "reduce_gradients", reduce)


def _rank_steps(strategy: dict, poison: str, clip=None):
    """Three fp16 steps on this rank, the second with an inf: per step (skipped, loss scale, whether
    the local parameters changed)."""
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        training = {**BASE["training"], "grad_clip_norm": clip}
        recipe = make_recipe(strategy, world_size=WORLD, precision="fp16", training=training)
        ctx = DistContext(rank, WORLD, rank, WORLD, CPU, "gloo", (CPU,))
        engine = strategies.build(recipe.strategy, make_setup(recipe, ctx))
        gen = torch.Generator().manual_seed(rank)
        out = []
        for step in range(3):
            x, y = torch.randn(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)
            if step == 1 and rank == 1:
                {"leaf": _poison_leaf_gradient, "shard": _poison_shard_after_reduction}[poison](engine)
            before = [_local(p.detach()).clone() for p in engine.parameters()]
            result = engine.train_step(x, y)
            if step == 1 and rank == 1:
                engine._remove_poison()
            changed = any(not torch.equal(b, _local(p.detach())) for b, p in zip(before, engine.parameters()))
            out.append((result.skipped, result.loss_scale, changed))
        return out, engine.scaling.skipped_steps
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("strategy, poison", [
    ({"name": "ddp"}, "leaf"),
    ({"name": "allreduce"}, "leaf"),
    ({"name": "fsdp"}, "shard"),  # FSDP2: DTensor shards, the plain scaler (torch reduces found-inf)
    ({"name": "fsdp1"}, "shard"),  # FSDP1: flat shards, ShardedGradScaler
    ({"name": "oss"}, "leaf"),
    ({"name": "oss", "gradients": "sharded_ddp"}, "leaf"),
])
def test_an_inf_gradient_skips_the_step_on_every_rank_and_halves_the_scale(strategy, poison):
    for steps, skipped_steps in run_ranks(_rank_steps, WORLD, strategy, poison):
        (skip0, scale0, changed0), (skip1, scale1, changed1), (skip2, scale2, changed2) = steps
        assert not skip0 and changed0 and scale0 == 2.0 ** 16  # a clean step trains, the scale stays
        assert skip1 and not changed1 and scale1 == scale0 / 2  # the inf: no update anywhere, half the scale
        assert not skip2 and changed2 and scale2 == scale1  # and the next step trains again
        assert skipped_steps == 1


def test_the_clip_sees_unscaled_gradients():
    """With a clip, the norm recorded under fp16 is the gradient's own (about fp32's), not the
    scaled one 65536 times larger."""
    norms = {}
    for precision in ("fp32", "fp16"):
        recipe = make_recipe({"name": "single"}, precision=precision,
                             training={**BASE["training"], "grad_clip_norm": 0.1})
        ctx = DistContext(0, 1, 0, 1, CPU, "gloo", (CPU,))
        engine = strategies.build(recipe.strategy, make_setup(recipe, ctx))
        x, y = torch.randn(32, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.arange(32) % 10
        norms[precision] = float(engine.train_step(x, y).grad_norm)
    assert norms["fp32"] > 0.1  # the clip binds
    assert abs(norms["fp16"] - norms["fp32"]) < 1e-2 * norms["fp32"], norms  # fp16's rounding, not x65536


def test_an_fp16_run_records_its_scale_and_skipped_steps(tmp_path):
    """Through the whole run on 2 ranks: every step row has the loss scale and whether it was
    skipped, each rank's summary the count; the losses learn and stay near fp32's (fp16 rounding)."""
    fp16 = step_losses(make_recipe({"name": "ddp"}, world_size=WORLD, precision="fp16"), tmp_path / "fp16")
    fp32 = step_losses(make_recipe({"name": "ddp"}, world_size=WORLD, precision="fp32"), tmp_path / "fp32")
    rows = list(read_metrics(tmp_path / "fp16", kind="step"))
    assert rows and all("loss_scale" in r and r["skipped"] is False for r in rows)
    summary = read_json(tmp_path / "fp16" / "summary.json")
    assert [r["skipped_steps"] for r in summary["ranks"]] == [0, 0]
    assert fp16[-1] < fp16[0]
    assert max(abs(a - b) for a, b in zip(fp16, fp32)) < 1e-2, (fp16, fp32)
    assert "loss_scale" not in next(iter(read_metrics(tmp_path / "fp32", kind="step")))  # fp32: nothing scales


@pytest.mark.parametrize("strategy", [{"name": "pipeline", "stages": 2}, {"name": "param_server"},
                                      {"name": "tensor", "tp": 2}])
def test_strategies_whose_steps_cannot_scale_refuse_fp16_naming_bf16(strategy):
    with pytest.raises(SuiteError, match=r"training\.precision=fp16.*loss scaling.*set training\.precision=bf16") as err:
        make_recipe(strategy, world_size=WORLD, precision="fp16")
    assert "\n" not in str(err.value)


def _save_and_resume(run_dir):
    from suite.train import checkpoint

    dist.init_process_group("gloo")
    try:
        recipe = make_recipe({"name": "ddp"}, world_size=WORLD, precision="fp16")
        ctx = DistContext(dist.get_rank(), WORLD, dist.get_rank(), WORLD, CPU, "gloo", (CPU,))
        saved = strategies.build(recipe.strategy, make_setup(recipe, ctx))
        saved.scaling.scale(torch.ones(()))  # the scale exists from the first scaled loss on
        saved.scaling.scaler.update(new_scale=1024.0)  # as after six skipped steps
        saved.scaling.skipped_steps = 6
        checkpoint.save(run_dir, ctx, saved, {"step": 8})
        resumed = strategies.build(recipe.strategy, make_setup(recipe, ctx))
        loop = checkpoint.load(run_dir, ctx, resumed)
        return loop["step"], resumed.scaling.loss_scale(), resumed.scaling.skipped_steps
    finally:
        dist.destroy_process_group()


def test_a_resumed_fp16_run_goes_on_at_its_loss_scale(tmp_path):
    """Each rank's checkpoint file keeps the scale and the skipped steps (ddp's checkpoint is the
    strategy-neutral one, whose model files know nothing of a scaler): a resume does not start
    again at 65536 and skip the steps it took to come down."""
    for step, scale, skipped in run_ranks(_save_and_resume, WORLD, tmp_path):
        assert (step, scale, skipped) == (8, 1024.0, 6)


def test_deepspeed_s_own_fp16_skips_are_recorded():
    """DeepSpeed scales fp16 itself (GPU only): a step its scaler skipped (``was_step_applied``
    false) is the step's ``skipped`` and counts in the summary's ``skipped_steps``."""
    from types import SimpleNamespace

    from suite.strategies._deepspeed import DeepSpeedEngine

    applied = iter([True, False, True])
    engine = DeepSpeedEngine.__new__(DeepSpeedEngine)
    engine.setup, engine.skipped_steps = SimpleNamespace(precision="fp16"), 0
    engine.ds = SimpleNamespace(was_step_applied=lambda: next(applied))
    assert [engine.skipped_step() for _ in range(3)] == [False, True, False]
    assert engine.scaling_record() == {"skipped_steps": 1}
    engine.setup = SimpleNamespace(precision="bf16")  # no scaler: nothing recorded
    assert engine.skipped_step() is None and engine.scaling_record() == {}
