"""A neutral checkpoint's model folder written as plain torch files, one per rank: the light
format for states of whole tensors (single, DDP, hand-written all-reduce, ZeRO's gathered state,
a pipeline's or layer split's stages), where DCP's planning is all cost and no use.

``model/rank<R>.pt`` holds, flattened to dotted keys (``model.conv.weight``,
``optimizer.conv.weight.exp_avg``), the entries of rank R's neutral state that no lower rank also
holds: replicated entries are written once (by the lowest rank holding them; the rule DCP's
own de-duplication follows), a pipeline stage's own entries by its rank. A state with a DTensor
in it (FSDP2, tensor parallel) is sharded and goes to DCP instead (``suite.train.checkpoint``).

Reading merges every rank's file and puts each entry into the reader's template: a whole tensor
as it is, a DTensor as this rank's part of the whole (``distribute_tensor`` with no source rank
slices locally, the same chunks FSDP2 and tensor parallelism hold). So either format resumes
under any strategy and world size.

Cost on 2 cores (benchmarks/base.yaml's CNN and Adam, 62k parameters): ``torch.save`` of the
state ~1 ms, DCP's ``save`` of the same 6-10 ms of mostly Python (planning, metadata,
collectives), which a background save takes from training on a machine whose cores the ranks
already fill.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def flat(state, prefix: str = "") -> dict:
    """``{"model": {"a.w": t}}`` -> ``{"model.a.w": t}``: the keys the rank files hold."""
    out = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        out.update(flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def plan(state: dict, group=None, run: str | None = None) -> tuple[bool, dict]:
    """Whether every rank's ``state`` is whole (then this format writes it), and this rank's
    share: its flat entries that no lower rank holds. Collective over ``group`` (or the default
    group): every rank's keys are gathered, once per ``run`` (a run's keys do not change between
    its saves, and a gather is two collectives that a background save would add to every
    training step it overlaps)."""
    entries = flat(state)
    is_whole = not any(_is_dtensor(v) for v in entries.values())  # a DTensor is sharded: DCP writes it
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return is_whole, entries
    mine = (run, id(group), is_whole, tuple(entries))
    if run is None or _plans.get(run, (None,))[0] != mine:
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, (is_whole, list(entries)), group=group)
        lower = set().union(*(keys for _, keys in everyone[:dist.get_rank(group)]))
        _plans.clear()  # one run's at a time
        _plans[run] = (mine, all(w for w, _ in everyone), {k for k in entries if k not in lower})
    _, use, owned = _plans[run]
    return use, {k: v for k, v in entries.items() if k in owned}


_plans: dict = {}  # run -> (this rank's signature, all whole, the keys it writes)


def write(folder: Path, rank: int, entries: dict) -> None:
    """This rank's file, written aside and moved into place (a crash leaves no half file); none
    where the rank holds nothing of its own (a data-parallel replica above rank 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    if entries:
        save_aside(entries, folder / f"rank{rank}.pt")


def save_aside(obj, path: Path, before_replace=None) -> None:
    """``torch.save`` to a hidden file beside ``path``, then moved into place (an atomic replace):
    a crash at any moment leaves the old file or the new one, never half of one; a failed write
    gives back what the half-written file took. ``before_replace()`` runs between the two (the
    tests' fault injection)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        torch.save(obj, tmp)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def present(folder: Path) -> bool:
    """Whether ``folder`` was written in this format (a DCP folder holds ``.metadata`` and ``*.distcp``)."""
    return any(Path(folder).glob("rank*.pt"))


def read(folder: Path) -> dict:
    """Every rank's entries merged (memory-mapped, on CPU)."""
    merged = {}
    for path in sorted(Path(folder).glob("rank*.pt")):
        merged.update(torch.load(path, map_location="cpu", weights_only=False, mmap=True))
    return merged


def fill(template: dict, saved: dict, prefix: str = "") -> None:
    """Put ``saved`` (``read``'s flat entries) into ``template`` (a neutral state of the reader's
    own layout), in place: whole tensors as saved, DTensors as this rank's part."""
    for k, v in template.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            fill(v, saved, key + ".")
            continue
        if key not in saved:
            raise KeyError(f"the checkpoint holds no entry {key!r}")
        got = saved[key]
        if _is_dtensor(v):
            from torch.distributed.tensor import distribute_tensor  # late: DTensor strategies only

            part = distribute_tensor(got.to(v.dtype), v.device_mesh, v.placements, src_data_rank=None)
            template[k] = part
        elif torch.is_tensor(v):
            template[k] = got.to(device=v.device, dtype=v.dtype).clone()
        else:
            template[k] = got


def _is_dtensor(x) -> bool:
    """Without importing DTensor's module (~1 s at start-up): no DTensor exists until it is loaded."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(x, module.DTensor)
