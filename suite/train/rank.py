"""What one rank runs: join the process group, build data, model and strategy, train through
the shared loop (``suite.train.loop``) and write the run record (rank 0 writes the summary).

Called by ``suite.submit.launch`` inside each submitit task, or through
``torchrun --nproc_per_node 2 -m suite.train RECIPE [key=value ...] [--out DIR]``.
"""
from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset

from suite import recipe as recipes, strategies
from suite.common import cpu_cap, network
from suite.common.errors import SuiteError
from suite.models import build as build_model, hf
from suite.models.task import Task
from suite.record import console, gpu, metrics, run_record
from suite.record.allocated import AllocatedPeak
from suite.train.tracking import RankLog
from suite.strategies import prepare
from suite.strategies.engine import Setup
from suite.train import balance, checkpoint, dist as sdist, stop
from suite.train.loop import StepLoop


def new_run_dir(recipe, out: str | Path) -> Path:
    return run_record.new_run_dir(recipe.name, recipes.dump(recipe), out)


def run(recipe, run_dir: str | Path | None = None, out: str | Path = "runs", watcher_pid: int | None = None,
        predict=None) -> Path:
    """Train this rank's part of the run; rank 0 writes ``summary.json``. Returns the run folder.

    ``watcher_pid``: the local ``suite.submit`` following the run; if it goes away, the run stops
    (cancelled, with a checkpoint) rather than train on unwatched. ``predict``: recipe -> the planner's
    prediction for the run, which rank 0 works out after training and keeps beside what it measured
    (the rank tasks, ``suite.tasks``, pass ``suite.planner.predict.prediction``; the planner sits
    above this layer, so it is handed in, not imported)."""
    launch = recipe.launch
    sdist.adopt_mpi_environment()  # ranks mpirun started learn their rank here, before it is recorded
    if run_dir is not None:  # before joining: a rank that dies in rendezvous is still known to have started
        run_record.record_rank_process(run_dir, int(os.environ.get("RANK", 0)))
    try:
        ctx = sdist.init(launch.device, launch.devices_per_task, launch.cpus_per_task, launch.collective_timeout_s,
                         launch.interface)
    except BaseException as e:  # the rendezvous failed: said in the run record, so the follower ends the run
        if run_dir is not None:
            _record_error(Path(run_dir), int(os.environ.get("RANK", 0)), e)
        raise
    cap = None
    try:
        if ctx.world_size != recipe.world_size:
            raise SuiteError(f"the recipe asks for world size {recipe.world_size} (launch.nodes x "
                             f"launch.tasks_per_node) but {ctx.world_size} ranks started")
        run_dir = _agree_run_dir(ctx, recipe, run_dir, out)
        if sdist.chosen_network is not None:  # which interface and address this rank talks on
            run_record.record_rank_network(run_dir, ctx.rank, sdist.chosen_network)
        try:
            cap = _cap_cpu(launch, ctx)  # launch.rank_cpu: this rank slowed on purpose (a refusal is recorded)
            _train(recipe, ctx, run_dir, watcher_pid, predict)
        except stop.Stopped:
            raise  # not the end: a requeued or resumed attempt goes on (in the same W&B run)
        except BaseException as e:
            _record_error(run_dir, ctx.rank, e)
            _release_frames(e)
            raise
    finally:
        if cap is not None:
            cap.release()
        sdist.close()
    return run_dir


def _release_frames(error: BaseException) -> None:
    """Drop the locals of the finished frames a failure passed through (its traceback, already in
    the rank's error file, keeps its lines), so that ``sdist.close`` frees the process group and
    its connections close now. Held by the engine in a frame of the traceback, a gloo group stayed
    open while the exception went on up: in the warm ranks' pool, where a failed rank's process
    lives on to reap its forked peers, those peers then waited in their collective for the
    follower's grace time (15 s) instead of failing at once with "Connection closed by peer"."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)  # skips the frames still running (this one's callers)
        error = error.__context__


def _cap_cpu(launch, ctx):
    """launch.rank_cpu: this rank's CPU capped at its share of the threads it was given
    (suite.common.cpu_cap), or None where it runs uncapped."""
    share = launch.rank_cpu[ctx.rank] if ctx.rank < len(launch.rank_cpu) else "100%"
    value = cpu_cap.percent(share, f"launch.rank_cpu.{ctx.rank}")
    if value >= 100:
        return None
    return cpu_cap.cap_this_process(value, torch.get_num_threads(), f"rank{ctx.rank}", f"launch.rank_cpu.{ctx.rank}")


def _agree_run_dir(ctx, recipe, run_dir, out) -> Path:
    box = [str(run_dir) if run_dir else None]
    if ctx.is_main and box[0] is None:
        box[0] = str(new_run_dir(recipe, out))
    if ctx.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def _record_error(run_dir: Path, rank: int, exc: BaseException) -> None:
    run_record.record_error(run_dir, rank, f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc)))


def make_setup(recipe, ctx, run_dir=None) -> Setup:
    tr, opt = recipe.training, recipe.optimizer
    spec = recipe.data.spec()

    def model_factory():
        torch.manual_seed(tr.seed)  # every rank and the baseline start from the same weights
        model = build_model(recipe.model, spec)
        if getattr(recipe.model, "loss", "task") == "model" and task.model_loss is None:
            task.use_model_loss(*hf.loss_function(model))
        if tr.init_perturbation:
            _perturb(model, tr.init_perturbation, tr.seed)
        return model

    task = Task(recipe.model.task, spec.num_classes)
    return Setup(ctx=ctx, build_model=model_factory, make_optimizer=lambda params: make_optimizer(opt, params),
                 task=task, layout=recipe.layout(),
                 activation_checkpointing=tr.activation_checkpointing, compile=tr.compile,
                 sync_batchnorm=tr.sync_batchnorm, grad_clip_norm=tr.grad_clip_norm, seed=tr.seed,
                 uneven_batches=tr.balance != "equal",
                 run_dir=str(run_dir) if run_dir else None, model_name=recipe.model.name)


def make_optimizer(opt, params) -> torch.optim.Optimizer:
    """The torch optimizer the recipe's ``optimizer`` section names, over ``params``."""
    if opt.name == "sgd":
        return torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
    cls = torch.optim.Adam if opt.name == "adam" else torch.optim.AdamW
    return cls(params, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay)


@torch.no_grad()
def _perturb(model, scale: float, seed: int) -> None:
    """training.init_perturbation: every floating parameter times (1 + scale x a standard normal
    draw), from a generator of its own (seeded apart from the weights'), so the weights, the data
    order and everything else draw as in the unperturbed run."""
    generator = torch.Generator().manual_seed(seed + 1)
    for p in model.parameters():
        if p.is_floating_point() and p.device.type != "meta":
            noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
            p.mul_(1 + scale * noise.to(p.device))


def _train(recipe, ctx, run_dir: Path, watcher_pid: int | None = None, predict=None) -> None:
    tr = recipe.training
    if ctx.is_main:
        # Merged into what is there: a resumed run keeps its earlier fields until it ends.
        run_record.update_summary(run_dir, status="running", name=recipe.name, started_at=time.time(),
                                  error=None, failed_rank=None)
    torch.manual_seed(tr.seed)
    train_set, val_set = recipe.data.load()  # float32 (or token ids) whatever the precision
    if recipe.strategy.owns_training:
        return _train_own_loop(recipe, ctx, run_dir, train_set, val_set, predict)
    setup = make_setup(recipe, ctx, run_dir)
    memory_start = _memory_start(recipe, ctx)
    allocated = AllocatedPeak(ctx.device, compiled=bool(tr.compile))
    allocated.start()
    try:
        with prepare.default_dtype(tr.precision):  # fp64: the model in float64; the loop casts the inputs
            _train_engine(recipe, ctx, run_dir, watcher_pid, setup, train_set, val_set, memory_start, allocated, predict)
    finally:
        allocated.stop()  # also on failure: the sampling never outlives training


def _train_engine(recipe, ctx, run_dir, watcher_pid, setup, train_set, val_set, memory_start, allocated, predict) -> None:
    tr = recipe.training
    engine = strategies.build(recipe.strategy, setup)
    if ctx.is_main:  # a resumed run redoes what came after its checkpoint: drop those records
        saved = checkpoint.latest(run_dir)
        run_record.truncate_metrics(run_dir, saved["metrics_bytes"] if saved else 0)
    log = RankLog.open(recipe, ctx, run_dir)  # run record + W&B + utilisation thread

    per_rank_batch = setup.layout.rank_batch
    sampler, balancer = _sampler(recipe, engine, train_set, ctx)
    batch = None if isinstance(sampler, balance.SharedBatches) else per_rank_batch  # it yields whole batches
    loader = recipe.data.train_loader(train_set, sampler, batch, tr.seed)  # augmented where asked
    if len(loader) == 0:
        raise SuiteError(f"training.batch_size={tr.batch_size} is larger than the training set "
                         f"({len(train_set)} samples); lower it")
    # Larger evaluation batches are cheap for one output per sample; a segmentation map per pixel
    # (a UNet's activations at full resolution) is not: it evaluates at the training batch.
    eval_batch = per_rank_batch if setup.task.kind == "segmentation" else max(per_rank_batch, 256)
    val_loader = DataLoader(Subset(val_set, range(engine.dp_rank, len(val_set), engine.dp_size)),
                            batch_size=eval_batch)
    total_steps = tr.epochs * len(loader)
    if tr.max_steps:
        total_steps = min(total_steps, tr.max_steps)

    lr_at = recipe.optimizer.schedule.rate(recipe.optimizer.lr, len(loader), total_steps)
    loop = StepLoop(ctx, engine, log, tr, total_steps, run_dir, setup.task, lr_at, allocated, balancer)
    loop.resume()
    stop.install_handlers(watcher_pid)
    printer = (lambda rec: print(console.epoch_line(rec, tr.epochs), flush=True)) if ctx.is_main else None
    try:
        epochs = loop.run(sampler, loader, val_loader, printer)
        _write_summary(recipe, ctx, engine, run_dir, loop, epochs, predict, memory_start, allocated.stop())
    except stop.Stopped as stopped:
        if ctx.is_main:
            run_record.update_summary(run_dir, status=stopped.status, steps=loop.step, attempts=loop.attempts)
        raise
    except BaseException:
        engine.abort()  # no graceful goodbyes to peers that may be gone
        loop.flush_local()  # keep what this rank measured; peers may be gone, so no reduction
        raise
    finally:
        log.close()  # also on failure: the utilisation thread stops, the file closes
        engine.close()


def _sampler(recipe, engine, train_set, ctx):
    """This rank's sampler, and the speed balancer where training.balance=speed (else None): the
    equal split's DistributedSampler, or suite.train.balance's batches with unequal shares."""
    tr = recipe.training
    if tr.balance == "equal":
        return DistributedSampler(train_set, num_replicas=engine.dp_size, rank=engine.dp_rank,
                                  shuffle=True, seed=tr.seed, drop_last=True), None
    shares = tr.balance_shares if tr.balance == "shares" else balance.equal_shares(tr.batch_size, engine.dp_size)
    batches = balance.SharedBatches(len(train_set), engine.dp_size, engine.dp_rank, tr.batch_size, tr.seed, shares)
    return batches, balance.SpeedBalancer(batches, tr.grad_accumulation, ctx.device) if tr.balance == "speed" else None


def _memory_start(recipe, ctx) -> int:
    """The resident set before the model is built (metrics.peak_memory_above_start_bytes), with the
    strategy's libraries imported first: their code is not the training's memory."""
    strategies.import_early([recipe.strategy.name])
    return metrics.memory_start_bytes(ctx.device)


def _predicted(recipe, run_dir, predict) -> dict | None:
    """The planner's prediction for this run (``predict``, see ``run``), made by rank 0 after training:
    its fake step of the model takes a second or more, which neither the timed loop nor the
    submitting side (before the first step) should pay. Kept in predicted.json, so a resumed run
    reuses it."""
    predicted = run_record.read_predicted(run_dir)
    if predicted is None and predict is not None:
        predicted = predict(recipe)
        run_record.record_predicted(run_dir, predicted)
    return predicted


def _train_own_loop(recipe, ctx, run_dir: Path, train_set, val_set, predict) -> None:
    """A strategy with its own loop (TensorFlow's) gets the data and this rank's log; what it
    returns carries the loop's fields (steps, samples, times, epochs, engine) for the summary."""
    log = RankLog.open(recipe, ctx, run_dir)
    try:
        run = strategies.STRATEGIES[recipe.strategy.name].train(recipe.strategy, recipe, ctx, train_set, val_set, log)
        _write_summary(recipe, ctx, run.engine, run_dir, run, run.epochs, predict)
    finally:
        log.close()


def _write_summary(recipe, ctx, engine, run_dir, loop, epochs, predict=None, memory_start: int | None = None,
                   peak_allocated: int | None = None) -> None:
    peak = metrics.peak_memory_bytes(ctx.device)
    mine = {"rank": ctx.rank, "peak_memory_bytes": peak,
            "peak_memory_above_start_bytes": None if memory_start is None else max(peak - memory_start, 0),
            "peak_allocated_bytes": peak_allocated,
            "peak_reserved_bytes": gpu.peak_reserved_bytes(ctx.device),  # CUDA: allocated plus the allocator's cache
            "held_bytes": engine.held_bytes(), "step_time_s": metrics.median(loop.step_times_s),
            "device": str(ctx.device), "strategy_metrics": engine.extra_metrics(),
            "cpu_quota": cpu_cap.quota_of_process(),  # CPUs it may use at most: launch.rank_cpu, a capped node
            "node": network.node_name()}  # Slurm's node name where it runs there
    mine.update(engine.scaling_record())  # fp16: steps an inf/NaN gradient skipped, the scale at the end
    if ctx.backend == "nccl":  # NCCL's version and NCCL_* settings, per rank: nodes may differ
        mine["nccl"] = sdist.nccl_settings(ctx.backend)
    if sdist.chosen_network is not None:  # the interface and address it talked on
        mine["network"] = sdist.chosen_network
    own_loop = not isinstance(loop, StepLoop)  # a strategy's own loop (TensorFlow's) measures neither
    mine.update({} if own_loop else loop.time_split())  # compute vs collective time per step, batch share
    mine.update(loop.log.rank_fields(ctx, loop))  # utilisation, throughput, device
    ranks = [None] * ctx.world_size
    if ctx.world_size > 1:
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    run_level = loop.log.run_fields(recipe, ctx, loop, ranks)  # FLOPs, MFU; each rank's summary record
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
        "samples_per_s": metrics.rate(loop.samples, loop.train_time_s),
        "tokens_per_s": metrics.tokens_per_s(loop.samples, loop.train_time_s, recipe.data.spec().tokens_per_sample),
        "step_time_s": metrics.median(r["step_time_s"] for r in ranks if r["step_time_s"] is not None),
        "epoch_time_s": [e["epoch_time_s"] for e in epochs],
        "eval_time_s": evals,
        "train_time_s": loop.train_time_s,
        # which loss trained; a strategy's own loop (TensorFlow's) trains Keras's sparse cross-entropy
        "loss": "keras: sparse categorical cross-entropy" if own_loop else loop.task.loss_name,
        "final": {k: last.get(k) for k in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "val_miou", "val_perplexity")
                  if last.get(k) is not None},
        "ranks": ranks,
        "straggler": metrics.straggler(ranks),  # the rank the others wait for, where one stands out
        "balance": None if own_loop else loop.balance_record(),  # training.balance=speed: measured, decided
        "started_at": loop.attempts[0]["started_at"],
        "finished_at": time.time(),
        "attempts": loop.attempts,
        "torch": torch.__version__,
        "predicted": _predicted(recipe, run_dir, predict),
        **run_level,
    }
    run_record.write_summary(run_dir, summary)  # replaces: no stale field of an earlier attempt stays
