"""One optimizer step of the real strategy code on fake tensors under a fake process group.

``profile_step(recipe, world_size)`` joins torch's ``fake`` process group as rank 0 of a world of
``world_size`` (every collective returns at once, nothing is sent), builds the model and the
strategy's Engine through the suite's own path (``suite.train.rank.make_setup`` and
``suite.strategies.build``) inside ``FakeTensorMode`` (tensors have shapes and dtypes, no
memory), and trains two steps on a fake batch of the layout's rank batch. The first creates the
optimizer state; the second is measured:

- held bytes: ``Engine.held_bytes()`` after it, the very call a real run records in summary.json;
- peak bytes: what the build and the first step left alive (parameters, buffers, optimizer
  state, the strategy's own buffers such as DDP's buckets) plus the most bytes of tensors
  created during the second step alive at once (``counting.LiveBytes``: storages counted once, freed
  when their last tensor goes), as a real run's ``peak_allocated_bytes`` counts them;
- reserved bytes (GPU recipes): the second step's allocations and frees replayed through the
  CUDA caching allocator's rules (``caching_allocator.replay``) on top of what the first left;
- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions, this rank's
  local shards under DTensor);
- collectives: every ``c10d`` and ``_c10d_functional`` op seen by a dispatch mode
  (``counting.Collectives``), sized by ``suite.planner.profile``'s byte conventions. That covers plain
  ``torch.distributed`` calls, FSDP's, DTensor's, and DDP's buckets (see
  ``suite.compat.torch.fake_friendly`` for what the real code needs to run on fake tensors).

A process may run this once: the process group and patched globals are not undone. The planner
(``run_isolated``) runs each (strategy, world size) in a forked child for that reason.
"""
from __future__ import annotations

import gc
import os
import time
import traceback
from contextlib import ExitStack, nullcontext

import torch
import torch.distributed as dist

from suite.compat import deepspeed as deepspeed_compat
from suite.compat import torch as torch_compat
from suite.models import empty
from suite.planner import analytic, caching_allocator, depth, point_cache
from suite.planner.counting import Collectives, LiveBytes, OpCosts, fake_batch
from suite.planner.profile import StepProfile
from torch.nn.parallel import DistributedDataParallel
import multiprocessing

def _ddp_hook(world_size: int):
    def hook(_state, bucket):
        buffer = bucket.buffer()
        dist.all_reduce(buffer)
        done = torch.futures.Future()
        done.set_result(buffer.div_(world_size))
        return done
    return hook


def _register_ddp_hooks(engine, world_size: int) -> bool:
    """True where the engine's module is DDP (``ddp``, ``layer_split`` at world > 1)."""

    module = getattr(engine, "module", None)
    if not isinstance(module, DistributedDataParallel):
        return False
    module.register_comm_hook(None, _ddp_hook(world_size))
    torch_compat.keep_ddp_buckets(module)
    return True


def at_world(recipe, world_size: int):
    """The recipe at this world size (one node of ``world_size`` ranks); SuiteError where the
    strategy or the batch refuses it."""
    from suite import recipe as recipes
    import yaml

    raw = yaml.safe_load(recipes.dump(recipe))
    raw["launch"] = {**raw["launch"], "executor": "local", "nodes": 1, "tasks_per_node": world_size}
    return recipes.validate(raw)


def profile_step(recipe, world_size: int) -> StepProfile:
    """Rank 0's cost of one optimizer step of ``recipe`` at ``world_size`` (see the module doc)."""
    from torch.utils.flop_counter import FlopCounterMode

    from suite import strategies
    from suite.strategies import prepare
    from suite.strategies.context import DistContext
    from suite.train.rank import make_setup
    from suite.train.dist import uses_cuda

    recipe = at_world(recipe, world_size)
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world_size, store=torch_compat.fake_store())
    launch = recipe.launch
    cpu = torch.device("cpu")
    ctx = DistContext(0, world_size, 0, world_size, cpu, "fake", (cpu,) * launch.devices_per_task)
    setup = make_setup(recipe, ctx)
    layout = setup.layout
    with ExitStack() as stack:
        stack.enter_context(torch_compat.fake_friendly())
        mode = stack.enter_context(torch_compat.fake_tensor_mode(allow_non_fake_inputs=True))
        if "deepspeed" in getattr(recipe.strategy, "warm_imports", ()):
            # DeepSpeed reads a norm and overflow flags in its step: answered "finite, no overflow";
            # any other strategy that reads a value still fails, and takes its rule.
            stack.enter_context(torch_compat.fake_scalars())
            stack.enter_context(deepspeed_compat.fake_friendly())
        build = setup.build_model  # a constructor that computes with real values: built outside the mode
        setup.build_model = lambda: empty.as_fake(build, mode, torch_compat.unset_fake_temporarily)
        stack.enter_context(prepare.default_dtype(recipe.training.precision))  # fp64: as the rank builds
        built = stack.enter_context(LiveBytes())  # what the build and the first step leave alive
        engine = strategies.build(recipe.strategy, setup)
        ddp = _register_ddp_hooks(engine, world_size)
        inputs, targets = fake_batch(recipe, layout.rank_batch)
        if (dtype := prepare.input_dtype(recipe.training.precision)) is not None and inputs.is_floating_point():
            inputs = inputs.to(dtype)
        engine.train_step(inputs, targets)  # creates the optimizer state
        start = built.alive_now()
        persistent = built.alive_sizes()
        gpu = uses_cuda(recipe.launch.device)
        live = LiveBytes(side_streams=getattr(recipe.strategy, "side_stream_collectives", ()) if gpu else None)
        comm, flops = Collectives(), FlopCounterMode(display=False)
        ops = OpCosts() if gpu else nullcontext()  # priced on a GPU profile
        with flops, live, comm, ops:
            engine.train_step(inputs, targets)
        held = {k: int(v) for k, v in engine.held_bytes().items()}
    notes = []
    if layout.degree("pipeline") > 1:
        notes.append("rank 0 is the first pipeline stage; other stages hold and send other amounts")
    if ddp:
        notes.append("DDP's buckets all-reduced by a comm hook doing what its default does; first buckets kept")
    # Which of its collectives are batch norm's, over the data-parallel ranks whatever group the
    # strategy declares for their kind: counted by the rule (the fake run sees kinds only).
    data_comm = analytic.data_comm(recipe)
    peak = int(start + live.peak)
    # On a GPU: the step replayed through the caching allocator's rules on what the build left
    reserved = max(peak, caching_allocator.replay(live.events(), persistent)["reserved_bytes"]) if gpu else None
    return StepProfile(strategy=recipe.strategy.name, world_size=world_size, held_bytes=held,
                       peak_bytes=peak, reserved_bytes=reserved, flops=int(flops.get_total_flops()),
                       samples=recipe.training.batch_size, comm_bytes=comm.bytes, comm_calls=comm.calls,
                       comm_sizes=comm.sizes,
                       data_comm=data_comm, copy_bytes=analytic.copy_bytes(recipe, comm.bytes, data_comm),
                       source="fake", notes="; ".join(notes),
                       # this rank's own operators, its optimizer's update on its shard among them
                       ops={"passes": ops.summary(), "update": {}} if isinstance(ops, OpCosts) else {})


# ---- one (strategy, world size) per forked child ----------------------------------------------

def plan_point(recipe, world_size: int, try_fake: bool = False) -> StepProfile:
    """The fake run where it works, else the analytic rule with the reason in ``notes``. A strategy
    whose real code does not run on fake tensors says why (``cannot_fake`` on its options class,
    what it failed with on torch 2.14 / DeepSpeed 0.19): its analytic rule then, unless asked to
    try again. SuiteError where the strategy declares no rules."""
    strategy = analytic.strategy_rules(recipe.strategy)
    reason = None if try_fake else (strategy.cannot_fake or None)
    if reason is None:
        try:
            return profile_step(recipe, world_size)
        except Exception as e:  # any failure of the real code on fake tensors: fall back, say why
            reason = f"the fake run failed: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    return analytic.profile(at_world(recipe, world_size), world_size, reason)


def _child(recipe, world_size, conn, try_fake, quiet, layers=None) -> None:
    torch.set_num_threads(1)
    # Objects in reference cycles (autograd's graph, hooks) are freed whenever the collector runs,
    # which depends on what the parent did before it forked: with it off, the live bytes counted
    # (and so the peak) are the same for the same point whoever asks. The child lives for one point.
    gc.collect()
    gc.disable()
    if layers is not None:  # a shallow copy, made here: validating it touches the model's globals
        recipe = depth.at_depth(recipe, layers)
    if quiet:  # what the real code prints on its way to failing on fake tensors: the parent says it in one line
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    try:
        conn.send(("ok", plan_point(recipe, world_size, try_fake).to_dict()))
    except BaseException as e:  # the parent reports it in one line
        conn.send(("error", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                   traceback.format_exc()))
    finally:
        conn.close()


class Job:
    """``plan_point`` in a forked child: the fake process group and the patched globals die
    with it. ``poll()`` is None while it runs, then ("ok", StepProfile) or ("error", line).

    A deep stack of identical blocks (``suite.planner.depth``) is run as its copies at 1, 2 and
    3 blocks, one child after another, and extrapolated to its depth, exactly; where the copies
    are not linear in depth, or one is not a fake run, the model runs at its own depth after them."""

    def __init__(self, recipe, world_size: int, timeout_s: float, try_fake: bool = False, quiet: bool = False,
                 whole: bool = False):
        self.recipe, self.world_size, self.try_fake, self.quiet = recipe, world_size, try_fake, quiet
        self.started = time.monotonic()
        self.timeout_s = timeout_s
        self.result = None
        self._shallow: list[dict] = []
        self._depths = list(depth.DEPTHS) if depth.reducible(recipe) and not whole else []  # whole: as written
        self._start(self._depths[0] if self._depths else None)

    def _start(self, layers) -> None:
        recipe = self.recipe
        self._key = point_cache.key(recipe, self.world_size, layers, self.try_fake)
        self._hit = point_cache.get(self._key)  # sized before with the same code: no child
        if self._hit is not None:
            self.process = None
            return
        context = multiprocessing.get_context("fork")  # the parent's imports (torch) come for free
        self._conn, child_end = context.Pipe(duplex=False)
        self.process = context.Process(target=_child, args=(recipe, self.world_size, child_end, self.try_fake, self.quiet, layers),
                                       daemon=True)
        self.process.start()
        child_end.close()

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def poll(self):
        if self.result is not None:
            return self.result
        result = None
        if self._hit is not None:
            result, self._hit = ("ok", self._hit), None
        elif self._conn.poll():
            try:
                status, payload, *_ = self._conn.recv()
            except EOFError:
                status, payload = "error", "the child died without a word"
            result = (status, payload)
            if status == "ok":
                point_cache.put(self._key, payload)
        elif not self.process.is_alive():
            result = ("error", f"the child exited with code {self.process.exitcode}")
        elif self.elapsed_s > self.timeout_s:
            self.process.kill()
            result = ("error", f"timed out after {self.timeout_s:.0f} s")
        if result is None:
            return None
        if self.process is not None:
            self.process.join(5)
        if self._depths and self.elapsed_s <= self.timeout_s:
            return self._next_depth(*result)
        self.result = (result[0], StepProfile.from_dict(result[1]) if result[0] == "ok" else result[1])
        return self.result

    def _next_depth(self, status, payload):
        """A shallow copy's result in: start the next copy, or extrapolate, or run the model as written."""
        if status == "ok" and payload["source"] == "fake":
            self._shallow.append(payload)
            if len(self._shallow) < len(self._depths):
                self._start(self._depths[len(self._shallow)])
                return None
            try:
                profile = depth.extrapolate(self._shallow, self.recipe.model.layers)
                notes = [profile["notes"]] if profile["notes"] else []
                profile["notes"] = "; ".join(notes + [f"copies at {', '.join(map(str, self._depths))} blocks "
                                                      f"extrapolated to {self.recipe.model.layers}"])
                self.result = ("ok", StepProfile.from_dict(profile))
                return self.result
            except depth.NotLinear:
                pass
        self._depths = []  # the model as written
        self._start(None)
        return None

def run_all(items, start, jobs: int = 2):
    """``start(item)`` (a ``Job``) for each item, ``jobs`` at a time; yields (item, job, result) as
    each ends (``Job.poll``'s result)."""
    todo, running = list(items), []
    while todo or running:
        while todo and len(running) < max(jobs, 1):
            item = todo.pop(0)
            running.append((item, start(item)))
        time.sleep(0.05)
        for entry in list(running):
            item, job = entry
            result = job.poll()
            if result is not None:
                running.remove(entry)
                yield item, job, result


def run_isolated(recipe, world_size: int, timeout_s: float = 300, try_fake: bool = False, whole: bool = False):
    """``plan_point`` in its own forked process (``Job``): ("ok", StepProfile) or ("error", one line)."""
    job = Job(recipe, world_size, timeout_s, try_fake, whole=whole)
    while job.poll() is None:
        time.sleep(0.05)
    return job.result


def warm() -> None:
    """Import what every child needs once, in the parent (forked children share it)."""
    # these imports are the point: done once here, before the children fork
    from torch.utils import flop_counter  # noqa: F401

    import suite.strategies  # noqa: F401
    import suite.train.rank  # noqa: F401
    torch_compat.fake_tensor_mode()  # imports dynamo, the bulk of the start-up

