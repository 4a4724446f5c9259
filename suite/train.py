"""The per-rank training loop, written once against the Engine interface.

Run by ``suite.launch`` inside each submitit task, or directly:
``torchrun --nproc_per_node 2 -m suite.train RECIPE [key=value ...] [--out DIR]``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import time
import traceback
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset

from suite import dist as sdist
from suite import measures, metrics, recipe as recipes, strategies, tracking
from suite.engine import Setup
from suite.errors import SuiteError
from suite.models import MODELS, build as build_model
from suite.task import Task


def new_run_dir(recipe, out: str | Path) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(out) / f"{recipe.name}-{stamp}-{uuid.uuid4().hex[:4]}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "recipe.yaml").write_text(recipes.dump(recipe))
    return run_dir.resolve()


def run(recipe, run_dir: str | Path | None = None, out: str | Path = "runs") -> Path:
    """Train this rank's part of the run; rank 0 writes ``summary.json``. Returns the run folder."""
    launch = recipe.launch
    ctx = sdist.init(launch.device, launch.devices_per_task, launch.cpus_per_task, launch.collective_timeout_s)
    try:
        if ctx.world_size != recipe.world_size:
            raise SuiteError(f"the recipe asks for world size {recipe.world_size} (launch.nodes x "
                             f"launch.tasks_per_node) but {ctx.world_size} ranks started")
        run_dir = _agree_run_dir(ctx, recipe, run_dir, out)
        try:
            _train(recipe, ctx, run_dir)
        except BaseException as e:
            _record_error(run_dir, ctx.rank, e)
            raise
    finally:
        sdist.close()
    return run_dir


def _agree_run_dir(ctx, recipe, run_dir, out) -> Path:
    box = [str(run_dir) if run_dir else None]
    if ctx.is_main and box[0] is None:
        box[0] = str(new_run_dir(recipe, out))
    if ctx.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def _record_error(run_dir: Path, rank: int, exc: BaseException) -> None:
    errors = run_dir / "errors"
    errors.mkdir(exist_ok=True)
    text = "".join(traceback.format_exception(exc))
    (errors / f"rank{rank}.txt").write_text(f"{time.time()}\n{type(exc).__name__}: {exc}\n\n{text}")


def make_setup(recipe, ctx, run_dir=None) -> Setup:
    tr, opt = recipe.training, recipe.optimizer
    spec = recipe.data.spec()

    def model_factory():
        torch.manual_seed(tr.seed)  # every rank and the baseline start from the same weights
        return build_model(recipe.model, spec)

    def make_optimizer(params):
        if opt.name == "sgd":
            return torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
        cls = torch.optim.Adam if opt.name == "adam" else torch.optim.AdamW
        return cls(params, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay)

    return Setup(ctx=ctx, build_model=model_factory, make_optimizer=make_optimizer,
                 task=Task(MODELS[recipe.model.name][0].task), precision=tr.precision,
                 grad_accumulation=tr.grad_accumulation, micro_batch_size=recipe.micro_batch_size(),
                 seed=tr.seed, run_dir=str(run_dir) if run_dir else None, model_name=recipe.model.name)


def _train(recipe, ctx, run_dir: Path) -> None:
    tr = recipe.training
    started = time.time()
    if ctx.is_main:
        tracking.write_json_atomic(run_dir / "summary.json", {"status": "running", "name": recipe.name,
                                                              "started_at": started})
    torch.manual_seed(tr.seed)
    train_set, val_set = recipe.data.load()
    setup = make_setup(recipe, ctx, run_dir)
    engine = strategies.build(recipe.strategy, setup)
    log = measures.open_log(recipe, ctx, run_dir)  # run record + W&B + utilisation sampler

    per_rank_batch = tr.batch_size // engine.dp_size
    sampler = DistributedSampler(train_set, num_replicas=engine.dp_size, rank=engine.dp_rank,
                                 shuffle=True, seed=tr.seed, drop_last=True)
    loader = DataLoader(train_set, batch_size=per_rank_batch, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        raise SuiteError(f"training.batch_size={tr.batch_size} is larger than the training set "
                         f"({len(train_set)} samples); lower it")
    val_loader = DataLoader(Subset(val_set, range(engine.dp_rank, len(val_set), engine.dp_size)),
                            batch_size=max(per_rank_batch, 256))
    total_steps = tr.epochs * len(loader)
    if tr.max_steps:
        total_steps = min(total_steps, tr.max_steps)

    loop = _Loop(ctx, engine, log, tr, total_steps)
    try:
        epochs = _epochs(ctx, engine, log, loop, tr, sampler, loader, val_loader, setup.task, total_steps)
    except BaseException:
        loop.flush_local()  # keep what this rank measured; peers may be gone, so no reduction
        raise
    _write_summary(recipe, ctx, engine, run_dir, loop, epochs, started)
    log.close()
    engine.close()


def _epochs(ctx, engine, log, loop, tr, sampler, loader, val_loader, task, total_steps) -> list[dict]:
    epochs = []
    for epoch in range(tr.epochs):
        sampler.set_epoch(epoch)
        train = loop.train_epoch(loader, epoch)
        evaluation = {}
        if tr.eval_every_epochs and ((epoch + 1) % tr.eval_every_epochs == 0
                                     or epoch == tr.epochs - 1 or loop.step >= total_steps):
            evaluation = _evaluate(ctx, engine, val_loader, task)
        record = {"epoch": epoch, **train, **evaluation}
        log.log("epoch", **record)
        epochs.append(record)
        if ctx.is_main:
            print(epoch_line(record, tr.epochs), flush=True)
        if loop.step >= total_steps:
            break
    return epochs


class _Loop:
    """Steps, timing and the batched reduction of per-step losses to global ones."""

    def __init__(self, ctx, engine, log, training, total_steps):
        self.ctx, self.engine, self.log, self.tr = ctx, engine, log, training
        self.total_steps = total_steps
        self.step = 0
        self.step_times_s: list[float] = []
        self.train_time_s = 0.0
        self.samples = 0  # global samples trained on
        self._pending = []

    def train_epoch(self, loader, epoch) -> dict:
        epoch_t0 = time.perf_counter()
        self._epoch_losses, self._epoch_correct, self._epoch_samples = [], 0.0, 0.0
        for inputs, targets in loader:
            inputs = inputs.to(self.ctx.device, non_blocking=True)
            targets = targets.to(self.ctx.device, non_blocking=True)
            with metrics.Stopwatch(self.ctx) as watch:
                result = self.engine.train_step(inputs, targets)
            self.step_times_s.append(watch.elapsed_s)
            self._pending.append((self.step, epoch, result, watch.elapsed_s))
            self.step += 1
            _maybe_fail(self.ctx.rank, self.step)
            if len(self._pending) >= self.tr.log_every_steps:
                self._flush()
            if self.step >= self.total_steps:
                break
        self._flush()
        epoch_time_s = time.perf_counter() - epoch_t0
        self.train_time_s += epoch_time_s
        out = {"epoch_time_s": epoch_time_s,
               "train_loss": sum(self._epoch_losses) / max(1, len(self._epoch_losses))}
        if self._epoch_samples and self.engine_has_accuracy:
            out["train_accuracy"] = self._epoch_correct / self._epoch_samples
        return out

    @property
    def engine_has_accuracy(self):
        return getattr(self.engine, "setup", None) is None or self.engine.setup.task.has_accuracy

    def flush_local(self) -> None:
        """Write pending steps with this rank's own loss only (used when a run fails)."""
        for step, epoch, r, step_time_s in self._pending:
            loss = r.loss.item() if r.loss is not None and r.samples else None
            self.log.log("step", step=step, epoch=epoch, global_loss=None, loss=loss,
                         samples=r.samples, step_time_s=step_time_s)
        self._pending = []

    def _flush(self) -> None:
        """One all-reduce for all pending steps: each step's global loss is the sample-weighted
        mean of the losses ranks computed (ranks with no loss, e.g. early pipeline stages, add 0)."""
        if not self._pending:
            return
        rows = []
        for _, _, r, _ in self._pending:
            has = r.loss is not None and r.samples > 0
            rows.append(torch.stack([
                (r.loss.detach().float() * r.samples) if has else torch.zeros((), device=self.ctx.device),
                torch.tensor(float(r.samples if has else 0), device=self.ctx.device),
                r.correct.detach().float() if (has and r.correct is not None) else torch.zeros((), device=self.ctx.device),
            ]))
        table = torch.stack(rows)
        local = table.clone()
        if self.ctx.world_size > 1:
            dist.all_reduce(table)
        for (step, epoch, r, step_time_s), row, mine in zip(self._pending, table.tolist(), local.tolist()):
            loss_sum, samples, correct = row
            global_loss = loss_sum / samples if samples else float("nan")
            self._epoch_losses.append(global_loss)
            self._epoch_correct += correct
            self._epoch_samples += samples
            self.samples += self.tr.batch_size
            self.log.log("step", step=step, epoch=epoch, global_loss=global_loss,
                         loss=(mine[0] / mine[1]) if mine[1] else None,
                         samples=r.samples, step_time_s=step_time_s)
        self._pending = []
        if self.ctx.is_main:
            rate = self.tr.batch_size / max(1e-9, self.step_times_s[-1])
            print(f"step {self.step}/{self.total_steps} loss {self._epoch_losses[-1]:.4f} "
                  f"{rate:.0f} samples/s", flush=True)


def _maybe_fail(rank: int, step: int) -> None:
    """Fault injection for testing failure handling: SCALESUITE_FAIL_AT=RANK:STEP."""
    spec = os.environ.get("SCALESUITE_FAIL_AT")
    if spec and spec == f"{rank}:{step}":
        raise RuntimeError(f"injected failure at rank {rank}, step {step} (SCALESUITE_FAIL_AT)")


@torch.no_grad()
def _evaluate(ctx, engine, loader, task) -> dict:
    with metrics.Stopwatch(ctx) as watch:
        sums = torch.zeros(3, device=ctx.device)
        for inputs, targets in loader:
            part = engine.eval_step(inputs.to(ctx.device), targets.to(ctx.device))
            if part is not None:
                sums += part
        if ctx.world_size > 1:
            dist.all_reduce(sums)
    loss_sum, correct, count = sums.tolist()
    out = {"val_loss": loss_sum / count if count else None, "eval_time_s": watch.elapsed_s}
    if task.has_accuracy and count:
        out["val_accuracy"] = correct / count
    return out


def epoch_line(rec: dict, epochs: int) -> str:
    parts = [f"epoch {rec['epoch'] + 1}/{epochs}", f"train_loss {rec['train_loss']:.4f}"]
    for key in ("val_loss", "val_accuracy"):
        if rec.get(key) is not None:
            parts.append(f"{key} {rec[key]:.4f}")
    parts.append(f"{rec['epoch_time_s']:.2f} s")
    return "  ".join(parts)


def _write_summary(recipe, ctx, engine, run_dir, loop, epochs, started) -> None:
    mine = {"rank": ctx.rank, "peak_memory_bytes": metrics.peak_memory_bytes(ctx.device),
            "held_bytes": engine.held_bytes(), "step_time_s": metrics.median(loop.step_times_s),
            "device": str(ctx.device), "strategy_metrics": engine.extra_metrics()}
    mine.update(measures.rank_fields(recipe, ctx, loop))  # utilisation, throughput, device
    ranks = [None] * ctx.world_size
    if ctx.world_size > 1:
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    run_level = measures.run_fields(recipe, ctx, loop, ranks)  # FLOPs, MFU; W&B summaries
    if not ctx.is_main:
        return
    last = epochs[-1] if epochs else {}
    evals = [e["eval_time_s"] for e in epochs if "eval_time_s" in e]
    summary = {
        "status": "completed",
        "name": recipe.name,
        "run_id": run_dir.name,
        "strategy": recipe.strategy.name,
        "model": recipe.model.name,
        "data": recipe.data.name,
        "world_size": ctx.world_size,
        "dp_size": engine.dp_size,
        "global_batch": recipe.training.batch_size,
        "precision": recipe.training.precision,
        "device": ctx.device.type,
        "backend": ctx.backend,
        "recipe_fingerprint": recipe.fingerprint(),
        "steps": loop.step,
        "epochs": len(epochs),
        "samples": loop.samples,
        "samples_per_s": loop.samples / loop.train_time_s if loop.train_time_s else None,
        "tokens_per_s": metrics.tokens_per_s(loop.samples, loop.train_time_s, recipe.data.spec().tokens_per_sample),
        "step_time_s": metrics.median(r["step_time_s"] for r in ranks if r["step_time_s"] is not None),
        "epoch_time_s": [e["epoch_time_s"] for e in epochs],
        "eval_time_s": evals,
        "train_time_s": loop.train_time_s,
        "final": {k: last.get(k) for k in ("train_loss", "train_accuracy", "val_loss", "val_accuracy")
                  if last.get(k) is not None},
        "ranks": ranks,
        "started_at": started,
        "finished_at": time.time(),
        "torch": torch.__version__,
        **run_level,
    }
    tracking.write_json_atomic(run_dir / "summary.json", summary)


def main(argv=None) -> int:
    """``torchrun ... -m suite.train RECIPE [key=value ...] [--out DIR] [--run-dir DIR]``"""
    parser = argparse.ArgumentParser(prog="python -m suite.train", description=main.__doc__)
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", default="runs")
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_intermixed_args(argv)
    try:
        points = recipes.load(args.recipe, args.overrides)
        if len(points) != 1:
            raise SuiteError("suite.train runs one recipe; a sweep is run by python -m suite.submit")
        world = int(os.environ.get("WORLD_SIZE", 1))
        recipe = points[0]
        if world != recipe.world_size:  # torchrun decides the world: take it, then re-check
            recipe = recipes.validate({**recipe.model_dump(mode="json"),
                                       "launch": {**recipe.launch.model_dump(mode="json"),
                                                  "nodes": 1, "tasks_per_node": world}})
        run_dir = run(recipe, args.run_dir, args.out)
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"run record: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
