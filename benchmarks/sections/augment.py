"""Augmentation cost: what random crop and flip (``data.augment``) add to fetching a training batch,
against the train step it feeds (``augment_cost.py``, in its own process with one thread)."""
from __future__ import annotations

from common import Section, script_json

SHARE = 0.03  # of a train step


def run(bench) -> Section:
    s = Section("Augmentation cost")
    m = script_json("augment_cost.py", "--repeats", "2" if bench.quick else "5")
    s.lines += [f"`base.yaml` data (synthetic 3x32x32, normalised), batches of {m['batch']}: mean fetch time per "
                "batch over one epoch, without and with `data.augment={crop_padding: 4, hflip: true}` (medians of "
                "interleaved epochs), and the cnn's median train step on one batch (`single`, one thread).", ""]
    s.table(["fetch, plain (ms)", "fetch, augmented (ms)", "train step (ms)", "added / step"],
            [[m["fetch_plain_ms"], m["fetch_augmented_ms"], m["step_ms"], m["added_share_of_step"]]])
    share = m["added_share_of_step"]
    s.check(f"augmentation adds <= {SHARE:.0%} of a train step per batch", f"{share:.2%}", share <= SHARE)
    return s
