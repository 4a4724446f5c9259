"""What a step costs, counted as it runs: the collectives it calls (kind, bytes, calls) and the
most bytes of tensors alive at once, both as dispatch modes over torch's operators; and a fake
batch shaped as the recipe's data. Used by the fake run (``fake_run``) and the analytic rule
(``analytic``)."""
from __future__ import annotations

import weakref
from collections import Counter

import torch

from suite.compat import torch as torch_compat

TorchDispatchMode = torch_compat.dispatch_mode_class()

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


def _storages(value) -> list:
    """The tensors of ``value`` that own memory: a wrapper subclass (DTensor) stands for its
    parts (its local shard), never for itself. A DTensor answers ``untyped_storage()`` with one the
    size of the whole, unsharded tensor, which holds no memory: counted, FSDP2's Adam state would
    be counted at full size beside its shards."""
    out = []
    for t in _tensors(value):
        if torch_compat.is_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            out += _storages([getattr(t, name) for name in names])
        else:
            out.append(t)
    return out


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Collectives(TorchDispatchMode):
    """Bytes, calls and each call's message size per collective kind, from the ops that reach the
    dispatcher: c10d ops (what ``torch.distributed`` calls and DDP's comm hook dispatch to) take
    the message as their first tensor argument(s) (inputs) or their first argument (outputs,
    all_gather's); functional collectives return their output."""

    def __init__(self):
        super().__init__()
        self.bytes: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.sizes: dict[str, dict[str, int]] = {}  # kind -> {message bytes (as text, for JSON): calls}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        known = _collective(func)
        if known:
            kind, which = known
            n = self._message_bytes(func, which, args, out)
            self.calls[kind] = self.calls.get(kind, 0) + 1
            self.bytes[kind] = self.bytes.get(kind, 0) + n
            sizes = self.sizes.setdefault(kind, {})
            sizes[str(n)] = sizes.get(str(n), 0) + 1
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


def _collective(func) -> tuple[str, str] | None:
    """(kind, which tensors are the message) of a c10d or functional collective op; else None."""
    if func.namespace not in ("c10d", "_c10d_functional"):
        return None
    name = func.__name__.split(".")[0]
    return _COLLECTIVES.get(name) or _COLLECTIVES.get(name.rstrip("_"))


def collective_kind(func) -> str | None:
    """The planner's kind of a collective op (``all_gather``, ...); None for any other op."""
    known = _collective(func)
    return known[0] if known else None


class LiveBytes(TorchDispatchMode):
    """The most bytes of storages created under this mode alive at once; a storage counts once
    (views share it) and leaves when it is freed. An op's output on one of its inputs' storages
    (an in-place update, a view, ``out=``) creates nothing: the optimizer's in-place step on the
    parameters and its state counted them as new, 66 MiB too many for an MLP of 22 MiB.

    ``side_streams``: where given, the collective kinds whose buffers the strategy allocates on
    a stream of their own (FSDP2's all-gather and reduce-scatter), and ``events()`` then gives
    the allocations and frees in order, each storage on the stream of the collective that used
    it (else ``compute``), for ``suite.planner.caching_allocator.replay``."""

    def __init__(self, side_streams=None):
        super().__init__()
        self.live = self.peak = 0
        self._seen: dict[int, weakref.ref] = {}
        self._log = [] if side_streams is not None else None
        self._side_streams = frozenset(side_streams or ())
        self._serial: dict[int, int] = {}  # storage key -> its allocation's number in the log
        self._stream: dict[int, str] = {}  # allocation number -> a side stream

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {torch_compat.storage_key(t) for t in _storages((args, tuple((kwargs or {}).values())))}
        for t in _storages(out):
            key = torch_compat.storage_key(t)
            if key is None or key in inputs or (key in self._seen and self._seen[key]() is not None):
                continue  # no storage of its own (a subclass: its parts are counted), or not new
            storage = t.untyped_storage()
            size = storage.nbytes()
            self._seen[key] = weakref.ref(storage, self._freed(key, size))
            self.live += size
            self.peak = max(self.peak, self.live)
            if self._log is not None:
                self._serial[key] = len(self._log)
                self._log.append(["alloc", len(self._log), size, "compute"])
        if self._log is not None and (kind := collective_kind(func)) in self._side_streams:
            for key in inputs | {torch_compat.storage_key(t) for t in _storages(out)}:
                if key in self._serial:
                    self._stream[self._serial[key]] = kind
        return out

    def events(self) -> list[tuple]:
        """The allocations and frees seen, in order (the class doc)."""
        return [("alloc", e[1], e[2], self._stream.get(e[1], e[3])) if e[0] == "alloc" else tuple(e)
                for e in self._log or ()]

    def alive_now(self) -> int:
        """Bytes of the storages created under this mode that are still alive, at their size now:
        FSDP frees a gathered parameter by resizing its storage to 0, which no op shows."""
        storages = (ref() for ref in list(self._seen.values()))
        return sum(s.nbytes() for s in storages if s is not None)

    def alive_sizes(self) -> list[int]:
        """Each still-alive storage's bytes now (``alive_now``'s parts)."""
        storages = (ref() for ref in list(self._seen.values()))
        return [s.nbytes() for s in storages if s is not None and s.nbytes()]

    def _freed(self, key, size):
        def callback(_):
            self.live -= size
            self._seen.pop(key, None)
            if self._log is not None and key in self._serial:
                self._log.append(("free", self._serial.pop(key)))
        return callback


MATMULS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}  # name -> which args multiply
ATTENTION_FORWARD = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"}
ATTENTION_BACKWARD = {f"{name}_backward" for name in ATTENTION_FORWARD}
NO_KERNEL = {"empty", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias", "lift_fresh", "_to_copy_meta",
             "set_", "resize_", "zeros_like_meta", "_local_scalar_dense", "is_nonzero", "sym_size", "sym_stride"}


class OpCosts(TorchDispatchMode):
    """What each operator run under it costs a GPU, counted as ``suite.planner.gpu_ops`` prices
    it: matmul shapes, fused attention shapes, and the bytes every other kernel reads and writes
    (views and allocations move none)."""

    def __init__(self):
        super().__init__()
        self.matmuls: Counter = Counter()  # (batch, m, n, k, element bytes) -> calls
        self.attention: Counter = Counter()  # (b, heads, s_q, s_kv, head_dim, causal, backward, element) -> calls
        self.memory_bytes = self.memory_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if func.namespace != "aten" or func.is_view or name in NO_KERNEL:
            return out
        if name in MATMULS:
            a, b = (args[i] for i in MATMULS[name])
            batch = a.shape[0] if a.dim() == 3 else 1
            self.matmuls[(batch, a.shape[-2], b.shape[-1], a.shape[-1], a.element_size())] += 1
        elif name in ATTENTION_FORWARD or name in ATTENTION_BACKWARD:
            backward = name in ATTENTION_BACKWARD
            q, k = [t for t in args if isinstance(t, torch.Tensor) and t.dim() == 4][1 if backward else 0:][:2]
            causal = any(a is True for a in args) or bool((kwargs or {}).get("is_causal"))
            b, heads, s_q, d = q.shape
            self.attention[(b, heads, s_q, k.shape[-2], d, causal, backward, q.element_size())] += 1
        else:
            moved = _nbytes(_tensors((args, tuple((kwargs or {}).values())))) + _nbytes(_tensors(out))
            if moved:
                self.memory_bytes += moved
                self.memory_ops += 1
        return out

    def summary(self, times: int = 1) -> dict:
        """JSON-able counts (``StepProfile.ops``' passes or update), each call ``times`` over."""
        return {"matmul": [[*key, calls * times] for key, calls in self.matmuls.items()],
                "attention": [[*key, calls * times] for key, calls in self.attention.items()],
                "memory": [self.memory_bytes * times, self.memory_ops * times]}


def fake_batch(recipe, samples: int):
    """(inputs, targets) of ``samples`` samples shaped as the data's spec says, for the task."""
    spec, task = recipe.data.spec(), recipe.model.task
    shape = (samples, *spec.input_shape)
    if spec.input_dtype == "int64":
        inputs = torch.randint(0, spec.input_vocab or spec.num_classes, shape)
    else:
        inputs = torch.randn(shape, dtype=getattr(torch, spec.input_dtype))
    classes = max(spec.num_classes, 1)
    if task == "language":  # the next token at each position: (samples, length), whatever the inputs stack
        targets = torch.randint(0, classes, (samples, spec.input_shape[-1]))
    elif task == "segmentation":
        targets = torch.randint(0, classes, (samples, *spec.input_shape[1:]))
    else:
        targets = torch.randint(0, classes, (samples,))
    return inputs, targets
