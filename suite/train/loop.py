"""The step loop: epochs, steps, timing, the batched reduction of per-step losses to global ones,
evaluation, and checkpoints (periodic, and on preemption) from which a run resumes exactly."""
from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from suite.record import console, metrics, run_record
from suite.record.allocated import STEPS as allocated_steps
from suite.strategies import prepare
from suite.train import checkpoint, stop


class StepLoop:
    def __init__(self, ctx, engine, log, training, total_steps, run_dir, task, lr_at=None, allocated=None,
                 balancer=None):
        self.ctx, self.engine, self.log, self.tr = ctx, engine, log, training
        # training.balance=speed (suite.train.balance): told every step's result until it has set the shares
        self.balancer = balancer
        self._sampler = None
        # this attempt's per-step split where the engine measures it (suite.strategies.clock); not
        # kept in checkpoints: the summary's medians are of the last attempt's steps
        self.compute_s: list[float] = []
        self.collective_s: list[float] = []
        # suite.record.allocated: counts the bytes allocated from the model build through the
        # first steps of this attempt, then stops (nothing sampled for the rest of the run)
        self.allocated = allocated
        self._allocated_until = None
        self.total_steps, self.run_dir, self.task = total_steps, run_dir, task
        # step -> lr (suite.recipe.schedule): a function of the step alone, so a resumed run goes on
        # with the same lrs without any schedule state in the checkpoint; None leaves the lr alone.
        self.lr_at = lr_at
        # fp64: float inputs cast to float64 (an evaluation-only loop may have no training section)
        self._input_dtype = prepare.input_dtype(getattr(training, "precision", "fp32"))
        self.step = 0
        self.step_times_s: list[float] = []
        self.train_time_s = 0.0
        self.samples = 0  # global samples trained on
        self.epochs: list[dict] = []  # one record per finished epoch
        self.attempts: list[dict] = []
        self._epoch = 0
        self._batch = 0  # batches done in the current epoch
        self._partial = _EpochSums()
        self._pending = []
        self._saved_step = 0

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self._input_dtype is not None and t.is_floating_point():
            return t.to(self.ctx.device, dtype=self._input_dtype, non_blocking=True)
        return t.to(self.ctx.device, non_blocking=True)

    # ---- resuming -------------------------------------------------------------------------
    _STATE = ("step", "step_times_s", "train_time_s", "samples", "epochs", "attempts",
              "_epoch", "_batch", "_partial", "_saved_step")

    def state(self) -> dict:
        return {k: getattr(self, k) for k in self._STATE}

    def resume(self) -> None:
        """Continue from the run folder's checkpoint, if it holds one; record this attempt.

        The attempts so far are the run record's (rank 0 reads them and tells the others, before
        it writes this one): an attempt that died before its first checkpoint is in the record
        only, and an automatic restart's attempt, with its cause, is announced there by the follower
        and completed here (run_record.announce_restart, start_attempt)."""
        restored = checkpoint.load(self.run_dir, self.ctx, self.engine)
        if restored:
            for key in self._STATE:
                setattr(self, key, restored[key])
        self._allocated_until = self.step + allocated_steps
        if getattr(self.tr, "checkpoint_every_steps", 0):  # its one-off costs before training, not in the first save's step
            checkpoint.prepare(self.ctx, self.engine)
        box = [run_record.recorded_attempts(self.run_dir) if self.ctx.is_main else None]
        if self.ctx.world_size > 1:
            dist.broadcast_object_list(box, src=0)
        self.attempts = run_record.start_attempt(  # with its strategy and world: a resume may change them
            box[0], self.attempts, self.step, strategy=self.engine.strategy or None, world_size=self.ctx.world_size,
            slurm_restart_count=int(os.environ.get("SLURM_RESTART_COUNT", 0)))
        if self.ctx.is_main:  # recorded now, not only at the next checkpoint: this attempt may die before it
            run_record.update_summary(self.run_dir, attempts=self.attempts)

    @property
    def attempt(self) -> int:
        return len(self.attempts)

    # ---- training -------------------------------------------------------------------------
    def run(self, sampler, loader, val_loader, printer=None) -> list[dict]:
        try:
            epochs = self._run_epochs(sampler, loader, val_loader, printer)
            if getattr(self.tr, "keep_final_weights", False) and self.step > self._saved_step:
                # training.keep_final_weights: the trained model stays in the run folder (suite.export)
                checkpoint.save(self.run_dir, self.ctx, self.engine, self.state())
                self._saved_step = self.step
        except BaseException:
            checkpoint.settle(self.run_dir)  # a save written beside training still completes, if it can
            raise
        checkpoint.finish(self.ctx, self.run_dir)  # a background save in flight completes before the run does
        return epochs

    def _run_epochs(self, sampler, loader, val_loader, printer) -> list[dict]:
        self._sampler = sampler
        for epoch in range(self._epoch, self.tr.epochs):
            self._epoch = epoch
            sampler.set_epoch(epoch)
            train = self._train_epoch(loader, epoch)
            evaluation = {}
            last = epoch == self.tr.epochs - 1 or self.step >= self.total_steps
            if self.tr.eval_every_epochs and ((epoch + 1) % self.tr.eval_every_epochs == 0 or last):
                evaluation = self._evaluate(val_loader)
            record = {"epoch": epoch, **train, **evaluation}
            self.log.log("epoch", attempt=self.attempt, **record)
            self.epochs.append(record)
            self._epoch, self._batch, self._partial = epoch + 1, 0, _EpochSums()
            if printer:
                printer(record)
            if self.step >= self.total_steps:
                break
        return self.epochs

    def _train_epoch(self, loader, epoch) -> dict:
        p = self._partial
        epoch_t0 = time.perf_counter() - p.elapsed_s
        for i, (inputs, targets) in enumerate(loader):
            if i < self._batch:  # resumed mid-epoch: the sampler's order is the same, skip what was done
                continue
            inputs, targets = self._to_device(inputs), self._to_device(targets)
            if self.lr_at:
                self.engine.set_lr(self.lr_at(self.step))
            with metrics.Stopwatch(self.ctx) as watch:
                result = self.engine.train_step(inputs, targets)
            self.step_times_s.append(watch.elapsed_s)
            self._note_split(result, inputs)
            self._pending.append((self.step, epoch, result, watch.elapsed_s))
            self.step += 1
            self._batch = i + 1
            if self.step == self._allocated_until and self.allocated:
                self.allocated.stop()
            _maybe_fail(self.ctx.rank, self.step, self.attempt, self.tr.fail_at)
            if len(self._pending) >= self.tr.log_every_steps or self._checkpoint_due():
                p.elapsed_s = time.perf_counter() - epoch_t0
                self._flush()
            if self.step >= self.total_steps:
                break
        self._flush()
        epoch_time_s = time.perf_counter() - epoch_t0
        self.train_time_s += epoch_time_s
        out = {"epoch_time_s": epoch_time_s, "train_loss": sum(p.losses) / max(1, len(p.losses))}
        if p.samples and self.task.has_accuracy:
            out["train_accuracy"] = p.correct / p.samples
        return out

    def _checkpoint_due(self) -> bool:
        every = self.tr.checkpoint_every_steps
        return bool(every) and self.step - self._saved_step >= every

    def flush_local(self) -> None:
        """Write pending steps with this rank's own loss only (used when a run fails)."""
        for step, epoch, r, step_time_s in self._pending:
            loss = r.loss.item() if r.loss is not None and r.samples else None
            self.log.log("step", attempt=self.attempt, step=step, epoch=epoch, global_loss=None, loss=loss,
                         samples=r.samples, step_time_s=step_time_s, lr=self._lr(step), **_grad_norm(r), **_scaling(r),
                         **_split(r))
        self._pending = []

    def _note_split(self, result, inputs) -> None:
        """Keep the step's compute/collective split; tell the speed balancer, which may time this
        rank and set the batch shares from the next step on (suite.train.balance)."""
        if result.compute_s is not None:
            self.compute_s.append(result.compute_s)
            self.collective_s.append(result.collective_s)
        if self.balancer is not None:
            decided = self.balancer.after_step(self.engine, inputs)
            if decided:
                self.log.log("balance", attempt=self.attempt, step=self.step, **decided)
                if self.ctx.is_main:
                    print(f"balance: batch shares {decided['shares']} from step {self.step + 1} on "
                          f"(forward samples/s per rank: "
                          f"{', '.join(f'{v:.0f}' for v in decided['samples_per_s'])})", flush=True)

    def time_split(self) -> dict:
        """This rank's summary fields: mean compute and collective time per step (means, not
        medians: a CPU capped by a CFS quota stalls in a few steps of each period, which a median
        leaves out), and its share of the global batch where training.balance gave unequal ones."""
        shares = getattr(self._sampler, "shares", None)
        return {"compute_s": _mean(self.compute_s), "collective_s": _mean(self.collective_s),
                "batch_share": shares[self.engine.dp_rank] if shares else None}

    def balance_record(self) -> dict | None:
        """training.balance=speed: what was measured and the shares decided (None otherwise)."""
        return self.balancer.record if self.balancer is not None else None

    def _lr(self, step: int) -> float | None:
        return self.lr_at(step) if self.lr_at else None

    def _flush(self) -> None:
        """One all-reduce for all pending steps: each step's global loss is the sample-weighted
        mean of the losses ranks computed (ranks with no loss, e.g. early pipeline stages, add 0).
        The same reduction carries the stop requests (suite.train.stop), so every rank stops at the
        same step."""
        if not self._pending:
            return
        # float64: an fp64 run's losses keep their digits; sample and correct counts stay exact
        f64 = {"dtype": torch.float64, "device": self.ctx.device}
        zero = torch.zeros((), **f64)
        rows = []
        for _, _, r, _ in self._pending:
            has = r.loss is not None and r.samples > 0
            rows.append(torch.stack([
                (r.loss.detach().double() * r.samples) if has else zero,
                torch.tensor(float(r.samples if has else 0), **f64),
                r.correct.detach().double() if (has and r.correct is not None) else zero,
            ]))
        requests = torch.tensor([[*stop.requests(), 0.0]], **f64)  # summed: any rank's
        table = torch.cat([torch.stack(rows), requests])
        local = table.clone()
        if self.ctx.world_size > 1:
            dist.all_reduce(table)
        p = self._partial
        for (step, epoch, r, step_time_s), row, mine in zip(self._pending, table.tolist(), local.tolist()):
            loss_sum, samples, correct = row
            global_loss = loss_sum / samples if samples else float("nan")
            p.losses.append(global_loss)
            p.correct += correct
            p.samples += samples
            self.samples += self.tr.batch_size
            self.log.log("step", attempt=self.attempt, step=step, epoch=epoch, global_loss=global_loss,
                         loss=(mine[0] / mine[1]) if mine[1] else None,
                         samples=r.samples, step_time_s=step_time_s, lr=self._lr(step), **_grad_norm(r), **_scaling(r),
                         **_split(r))
        self._pending = []
        if self.ctx.is_main:
            rate = self.tr.batch_size / max(1e-9, self.step_times_s[-1])
            print(console.step_line(self.step, self.total_steps, p.losses[-1], rate), flush=True)
        preempted, cancelled = (v > 0 for v in table[-1, :2].tolist())
        if preempted or cancelled or self._checkpoint_due():
            # beside training (checkpoint.save), but whole before a stop ends the process
            checkpoint.save(self.run_dir, self.ctx, self.engine, self.state(), background=not (preempted or cancelled))
            self._saved_step = self.step
        if preempted:
            if self.ctx.is_main:
                print(f"preempted: checkpoint saved at step {self.step}; handing over to requeue", flush=True)
            stop.hand_over_to_submitit(self.ctx)
        if cancelled:
            if self.ctx.is_main:
                print(f"cancelled: checkpoint saved at step {self.step}", flush=True)
            stop.cancel(self.ctx)

    @torch.no_grad()
    def _evaluate(self, loader) -> dict:
        ctx = self.ctx
        with metrics.Stopwatch(ctx) as watch:
            # float64: segmentation adds per-class pixel counts (Task.evaluate), beyond float32's exact range.
            sums = torch.zeros(self.task.eval_size, dtype=torch.float64, device=ctx.device)
            for inputs, targets in loader:
                part = self.engine.eval_step(self._to_device(inputs), self._to_device(targets))
                if part is not None:
                    sums += part
            if ctx.world_size > 1:
                dist.all_reduce(sums)
        loss_sum, correct, count = sums.tolist()[:3]
        out = {"val_loss": loss_sum / count if count else None, "eval_time_s": watch.elapsed_s}
        if self.task.has_accuracy and count:
            out["val_accuracy"] = correct / count
        out.update(self.task.eval_results(sums.tolist()))
        return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _split(result) -> dict:
    """The step's compute and collective seconds on this rank, where the engine splits them."""
    if result.compute_s is None:
        return {}
    return {"compute_s": result.compute_s, "collective_s": result.collective_s}


def _scaling(result) -> dict:
    """fp16's loss scale after the step and whether an inf/NaN gradient skipped it, where the
    engine scales (suite.strategies.scaling; else nothing)."""
    out = {} if result.skipped is None else {"skipped": result.skipped}
    return out if result.loss_scale is None else {**out, "loss_scale": result.loss_scale}


def _grad_norm(result) -> dict:
    """The step's global gradient norm before clipping, where the recipe clips (else nothing)."""
    return {} if result.grad_norm is None else {"grad_norm": float(result.grad_norm)}


class _EpochSums:
    """What an epoch has accumulated so far (kept in checkpoints taken mid-epoch)."""

    def __init__(self):
        self.losses: list[float] = []
        self.correct = 0.0
        self.samples = 0.0
        self.elapsed_s = 0.0


def _maybe_fail(rank: int, step: int, attempt: int = 1, planned: str = "") -> None:
    """Fault injection for testing failure handling: SCALESUITE_FAIL_AT=RANK:STEP raises there,
    RANK:STEP:kill kills the process (SIGKILL: no Python error, as with the OOM killer).
    Several, comma-separated; ``@A`` after one fires it in attempt A only (the run record's
    attempt number), e.g. ``1:5:kill@1,0:9:kill@2`` for a run restarted after each.
    RANK:STEP:pause sleeps there for 10 minutes (a test takes the rank's node away meanwhile).
    (RANK:STEP:kill-in-save is suite.train.checkpoint's: a kill in the middle of a save.)
    ``planned`` is the recipe's training.fail_at, the same format, applied beside the variable."""
    for spec in f"{os.environ.get('SCALESUITE_FAIL_AT', '')},{planned}".split(","):
        spec, _, only = spec.strip().partition("@")
        if only and only != str(attempt):
            continue
        if spec == f"{rank}:{step}:kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if spec == f"{rank}:{step}:pause":
            time.sleep(600)
        if spec == f"{rank}:{step}":
            raise RuntimeError(f"injected failure at rank {rank}, step {step} (SCALESUITE_FAIL_AT)")
