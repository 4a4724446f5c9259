"""One optimizer step of the real strategy code on fake tensors under a fake process group.

``profile_step(recipe, world_size)`` joins torch's ``fake`` process group as rank 0 of a world of
``world_size`` (every collective returns at once, nothing is sent), builds the model and the
strategy's Engine through the suite's own path (``suite.train.rank.make_setup`` and
``suite.strategies.build``) inside ``FakeTensorMode`` (tensors have shapes and dtypes, no
memory), and trains two steps on a fake batch of the plan's rank batch. The first creates the
optimizer state; the second is measured:

- held bytes: ``Engine.held_bytes()`` after it, the very call a real run records in summary.json;
- peak bytes: what the build and the first step left alive (parameters, buffers, optimizer
  state, the strategy's own buffers such as DDP's buckets) plus the most bytes of tensors
  created during the second step alive at once (``_LiveBytes``: storages counted once, freed
  when their last tensor goes), as a real run's ``peak_allocated_bytes`` counts them;
- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions, this rank's
  local shards under DTensor);
- collectives: every ``c10d`` and ``_c10d_functional`` op seen by a dispatch mode
  (``_Collectives``), sized by ``suite.planner.profile``'s byte conventions. That covers plain
  ``torch.distributed`` calls, FSDP's, DTensor's, and DDP's buckets (see
  ``suite.compat.torch.fake_friendly`` for what the real code needs to run on fake tensors).

A process may run this once: the process group and patched globals are not undone. The planner
(``run_isolated``) runs each (strategy, world size) in a forked child for that reason.
"""
from __future__ import annotations

import time
import traceback
import weakref
from contextlib import ExitStack

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from suite.compat import torch as torch_compat
from suite.planner import analytic
from suite.planner.profile import StepProfile

_COLLECTIVES = {  # op name (without namespace and trailing _) -> (kind, which tensors are the message)
    "allreduce": ("all_reduce", "input"), "allreduce_coalesced": ("all_reduce", "input"),
    "all_reduce": ("all_reduce", "input"), "all_reduce_coalesced": ("all_reduce", "input"),
    "_allgather_base": ("all_gather", "output"), "allgather": ("all_gather", "output"),
    "allgather_into_tensor_coalesced": ("all_gather", "output"), "allgather_coalesced": ("all_gather", "output"),
    "all_gather_into_tensor": ("all_gather", "output"), "all_gather_into_tensor_coalesced": ("all_gather", "output"),
    "_reduce_scatter_base": ("reduce_scatter", "input"), "reduce_scatter": ("reduce_scatter", "input"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "input"), "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "broadcast": ("broadcast", "input"), "alltoall": ("all_to_all", "input"), "alltoall_base": ("all_to_all", "input"),
    "all_to_all_single": ("all_to_all", "input"), "send": ("send", "input"), "recv": ("recv", "input"),
    "recv_any_source": ("recv", "input"), "barrier": ("barrier", "none"),
    # Not among the planner's kinds; kept under their own names so that nothing goes uncounted.
    "reduce": ("reduce", "input"), "gather": ("gather", "input"), "scatter": ("scatter", "output"),
}


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class _Collectives(TorchDispatchMode):
    """Bytes and calls per collective kind, from the ops that reach the dispatcher: c10d ops
    (what ``torch.distributed`` calls and DDP's comm hook dispatch to) take the message as their
    first tensor argument(s) (inputs) or their first argument (outputs, all_gather's); functional
    collectives return their output."""

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace in ("c10d", "_c10d_functional"):
            name = func.__name__.split(".")[0]
            known = _COLLECTIVES.get(name) or _COLLECTIVES.get(name.rstrip("_"))
            if known:
                kind, which = known
                self.calls[kind] = self.calls.get(kind, 0) + 1
                self.bytes[kind] = self.bytes.get(kind, 0) + self._message_bytes(func, which, args, out)
        return out

    @staticmethod
    def _message_bytes(func, which, args, out) -> int:
        if which == "none":
            return 0
        functional = func.namespace == "_c10d_functional"
        if which == "output":
            return _nbytes(_tensors(out if functional else args[0]))
        if functional:
            return _nbytes(_tensors(args[0]))
        # c10d in-place ops: (tensors, ...) or, with a separate output, (outputs, inputs, ...).
        separate = func.__name__.split(".")[0].rstrip("_") in ("_reduce_scatter_base", "reduce_scatter",
                                                                 "reduce_scatter_tensor_coalesced", "alltoall",
                                                                 "alltoall_base")
        return _nbytes(_tensors(args[1] if separate else args[0]))


class _LiveBytes(TorchDispatchMode):
    """The most bytes of storages created under this mode alive at once; a storage counts once
    (views share it) and leaves when it is freed. An op's output on one of its inputs' storages
    (an in-place update, a view, ``out=``) creates nothing: the optimizer's in-place step on the
    parameters and its state counted them as new, 66 MiB too many for an MLP of 22 MiB."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._seen: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_key(t) for t in _tensors((args, tuple((kwargs or {}).values())))}
        for t in _tensors(out):
            key = _storage_key(t)
            if key is None or key in inputs or (key in self._seen and self._seen[key]() is not None):
                continue  # no storage of its own (a subclass: its parts are counted), or not new
            storage = t.untyped_storage()
            size = storage.nbytes()
            self._seen[key] = weakref.ref(storage, self._freed(key, size))
            self.live += size
            self.peak = max(self.peak, self.live)
        return out

    def alive_now(self) -> int:
        """Bytes of the storages created under this mode that are still alive, at their size now:
        FSDP frees a gathered parameter by resizing its storage to 0, which no op shows."""
        storages = (ref() for ref in list(self._seen.values()))
        return sum(s.nbytes() for s in storages if s is not None)

    def _freed(self, key, size):
        def callback(_):
            self.live -= size
            self._seen.pop(key, None)
        return callback


def _storage_key(t):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


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
    from torch.nn.parallel import DistributedDataParallel

    module = getattr(engine, "module", None)
    if not isinstance(module, DistributedDataParallel):
        return False
    module.register_comm_hook(None, _ddp_hook(world_size))
    torch_compat.keep_ddp_buckets(module)
    return True


def fake_batch(recipe, samples: int):
    """(inputs, targets) of ``samples`` samples shaped as the data's spec says, for the task."""
    spec, task = recipe.data.spec(), recipe.model.task
    shape = (samples, *spec.input_shape)
    if spec.input_dtype == "int64":
        inputs = torch.randint(0, spec.input_vocab or spec.num_classes, shape)
    else:
        inputs = torch.randn(shape, dtype=getattr(torch, spec.input_dtype))
    classes = max(spec.num_classes, 1)
    if task == "language":
        targets = torch.randint(0, classes, shape)
    elif task == "segmentation":
        targets = torch.randint(0, classes, (samples, *spec.input_shape[1:]))
    else:
        targets = torch.randint(0, classes, (samples,))
    return inputs, targets


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
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from suite import strategies
    from suite.strategies import prepare
    from suite.train.dist import DistContext
    from suite.train.rank import make_setup

    recipe = at_world(recipe, world_size)
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world_size, store=torch_compat.fake_store())
    launch = recipe.launch
    cpu = torch.device("cpu")
    ctx = DistContext(0, world_size, 0, world_size, cpu, "fake", (cpu,) * launch.devices_per_task)
    setup = make_setup(recipe, ctx)
    plan = setup.plan
    with ExitStack() as stack:
        stack.enter_context(torch_compat.fake_friendly())
        stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        stack.enter_context(prepare.default_dtype(recipe.training.precision))  # fp64: as the rank builds
        built = stack.enter_context(_LiveBytes())  # what the build and the first step leave alive
        engine = strategies.build(recipe.strategy, setup)
        ddp = _register_ddp_hooks(engine, world_size)
        inputs, targets = fake_batch(recipe, plan.rank_batch)
        if (dtype := prepare.input_dtype(recipe.training.precision)) is not None and inputs.is_floating_point():
            inputs = inputs.to(dtype)
        engine.train_step(inputs, targets)  # creates the optimizer state
        start = built.alive_now()
        comm, live, flops = _Collectives(), _LiveBytes(), FlopCounterMode(display=False)
        with flops, live, comm:
            engine.train_step(inputs, targets)
        held = {k: int(v) for k, v in engine.held_bytes().items()}
    notes = []
    if plan.degree("pipeline") > 1:
        notes.append("rank 0 is the first pipeline stage; other stages hold and send other amounts")
    if ddp:
        notes.append("DDP's buckets all-reduced by a comm hook doing what its default does; first buckets kept")
    return StepProfile(strategy=recipe.strategy.name, world_size=world_size, held_bytes=held,
                       peak_bytes=int(start + live.peak), flops=int(flops.get_total_flops()),
                       samples=recipe.training.batch_size, comm_bytes=comm.bytes, comm_calls=comm.calls,
                       copy_bytes=analytic.copy_bytes(recipe, comm.bytes), source="fake", notes="; ".join(notes))


# ---- one (strategy, world size) per forked child ----------------------------------------------

# Strategies whose real code does not run on fake tensors (what it failed with, tried on torch
# 2.14 / DeepSpeed 0.19); the planner uses their analytic rule unless asked to try again.
CANNOT_FAKE = {
    "zero": "DeepSpeed reads tensor values during its step (aten._local_scalar_dense: .item() on a "
            "fake tensor has no value)",
    "ds_pipeline": "DeepSpeed's pipeline engine reads tensor values while it starts (.tolist() of "
                   "the parameter counts it all-reduces over the stages)",
    "pipeline": "torch.distributed.pipelining infers stage shapes by messages between ranks, which "
                "the fake process group does not carry (it would need static stage metadata)",
}


def plan_point(recipe, world_size: int, try_fake: bool = False) -> StepProfile:
    """The fake run where it works, else the analytic rule with the reason in ``notes``."""
    from suite.planner import analytic

    reason = None if try_fake else CANNOT_FAKE.get(recipe.strategy.name)
    if reason is None:
        try:
            return profile_step(recipe, world_size)
        except Exception as e:  # any failure of the real code on fake tensors: fall back, say why
            reason = f"the fake run failed: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    return analytic.profile(at_world(recipe, world_size), world_size, reason)


def _child(recipe, world_size, conn, try_fake) -> None:
    torch.set_num_threads(1)
    try:
        conn.send(("ok", plan_point(recipe, world_size, try_fake).to_dict()))
    except BaseException as e:  # the parent reports it in one line
        conn.send(("error", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}",
                   traceback.format_exc()))
    finally:
        conn.close()


class Job:
    """``plan_point`` in a forked child: the fake process group and the patched globals die
    with it. ``poll()`` is None while it runs, then ("ok", StepProfile) or ("error", line)."""

    def __init__(self, recipe, world_size: int, timeout_s: float, try_fake: bool = False):
        import multiprocessing

        context = multiprocessing.get_context("fork")  # the parent's imports (torch) come for free
        self._conn, child_end = context.Pipe(duplex=False)
        self.process = context.Process(target=_child, args=(recipe, world_size, child_end, try_fake), daemon=True)
        self.started = time.monotonic()
        self.timeout_s = timeout_s
        self.process.start()
        child_end.close()
        self.result = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def poll(self):
        if self.result is not None:
            return self.result
        if self._conn.poll():
            try:
                status, payload, *_ = self._conn.recv()
            except EOFError:
                status, payload = "error", "the child died without a word"
            self.result = (status, StepProfile.from_dict(payload) if status == "ok" else payload)
        elif not self.process.is_alive():
            self.result = ("error", f"the child exited with code {self.process.exitcode}")
        elif self.elapsed_s > self.timeout_s:
            self.process.kill()
            self.result = ("error", f"timed out after {self.timeout_s:.0f} s")
        if self.result is not None:
            self.process.join(5)
        return self.result


def run_isolated(recipe, world_size: int, timeout_s: float = 300, try_fake: bool = False):
    """``plan_point`` in its own forked process: ("ok", StepProfile) or ("error", one line)."""
    job = Job(recipe, world_size, timeout_s, try_fake)
    while job.poll() is None:
        time.sleep(0.05)
    return job.result


def warm() -> None:
    """Import what every child needs once, in the parent (forked children share it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils import flop_counter  # noqa: F401

    import suite.strategies  # noqa: F401
    import suite.train.rank  # noqa: F401
    FakeTensorMode()  # imports dynamo, the bulk of the start-up

