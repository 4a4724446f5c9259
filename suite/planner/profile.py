"""StepProfile: the cost of one optimizer step to one rank, the planner's common currency.

Produced by the fake run (real strategy code on fake tensors under a fake process group) or, where
a strategy cannot run that way, by its analytic rule (``source`` says which); consumed by the time
model (compute over the calibrated rate, each collective kind over its fitted latency/bandwidth)
and by the report's predicted-vs-measured columns.

Byte conventions, shared by the fake run, the calibration and the time model:
- ``held_bytes``: bytes a rank keeps between steps, by ``parameters``, ``gradients``,
  ``optimizer_state`` (the keys of ``suite.planner.memory.predicted_held_bytes``'s ``per_rank``).
- ``peak_bytes``: the most bytes a rank holds at any moment of the step, activations and
  temporary buffers included (allocated bytes, ``torch.cuda.max_memory_allocated``'s count).
- ``reserved_bytes``: on a GPU, what the caching allocator holds from CUDA at its most for
  those allocations (``torch.cuda.max_memory_reserved``'s count): rounding, fragmentation and
  the strategy's side streams' cached buffers beside ``peak_bytes``.
- ``comm_bytes[kind]``: per rank per optimizer step, the size in bytes of the buffer the rank
  hands to each collective call of that kind, summed over calls (for all_gather the output
  buffer, for reduce_scatter the input buffer, for send/recv the tensor sent or received). It is
  the message size, not the traffic on the wire; the calibration fits time against the same size.
- ``comm_sizes[kind]``: ``{message bytes: calls}``, each call's size (keys as text, for JSON),
  where the fake run counted them (empty for the analytic rule). A kind's calls are priced size by
  size (``alpha_beta.beta_of_sizes``): ZeRO's 4-byte norm all-reduce beside its gradient
  all-reduce halves the kind's mean size, and the bandwidth at half the size is not the gradient's.
- ``data_comm[kind]``: ``[bytes, calls]``, the part of ``comm_bytes``/``comm_calls`` of that kind
  that runs over the data-parallel ranks whatever group the strategy declares for the kind
  (``comm_axes``), one call at a time between pieces of compute: batch norm synced over the
  ranks. FSDP's own all-reduce runs over its replicas (none in plain FSDP), HSDP's gathers
  over a shard group; a synced batch norm's over every rank that reads other samples. The time
  model times this part over that group and hides none of it.
- ``copy_bytes``: per rank per step, the bytes a strategy copies in memory besides compute and
  collectives (FSDP2 packs each unit's shards into the gather's input and unpacks its output,
  and packs the gradients into the reduce-scatter's input); timed at the calibration's copy rate.
- kinds: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``all_to_all``,
  ``send``, ``recv``, ``barrier``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
                    "send", "recv", "barrier")


@dataclass
class StepProfile:
    strategy: str
    world_size: int
    held_bytes: dict[str, int]
    peak_bytes: int
    flops: int                      # per rank per optimizer step, forward + backward (+ recompute)
    samples: int                    # global samples per optimizer step (training.batch_size)
    comm_bytes: dict[str, int] = field(default_factory=dict)
    comm_calls: dict[str, int] = field(default_factory=dict)
    data_comm: dict[str, list[int]] = field(default_factory=dict)  # [bytes, calls] by kind (module doc)
    comm_sizes: dict[str, dict[str, int]] = field(default_factory=dict)  # {bytes: calls} by kind (module doc)
    copy_bytes: int = 0
    source: str = "fake"            # "fake": measured on fake tensors; "analytic": a formula
    notes: str = ""                 # e.g. why a figure is analytic
    stage_share: float | None = None  # the busiest pipeline stage's share of the model's FLOPs (None: not cut)
    # A GPU's operators of the step (suite.planner.gpu_ops): {"passes": counts, "update": counts,
    # "update_share": the share of the optimizer's update this rank steps}; empty where not counted.
    ops: dict = field(default_factory=dict)
    # On a GPU profile: what PyTorch's caching allocator reserves at its most (suite.planner.
    # caching_allocator), the figure torch.cuda.max_memory_reserved gives; None where not modelled.
    reserved_bytes: int | None = None

    @property
    def fit_bytes(self) -> int:
        """What must fit in a rank's memory: on a GPU what the caching allocator reserves (it may
        hand cached blocks back and retry when CUDA runs out, so this errs on the safe side), else
        the allocated peak. ``suite.plan`` and the advisor decide fit on it alike."""
        return self.reserved_bytes if self.reserved_bytes is not None else self.peak_bytes

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StepProfile":
        return cls(**d)
