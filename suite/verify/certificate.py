"""The verdict: per-step differences against the noise floor (``judge``), and its record."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

# How far above the floor a correct strategy may land. Rounding in another order (the strategy's
# all-reduce, its shards' sums) and the floor's one-ulp nudge of the weights start trajectories that
# part at the same rate, but not from exactly the same distance: measured on the suite's models and
# torchvision's, a correct strategy sat within 0.01x-30x of the running floor. A bug lands 1e3x (fp32)
# to 1e10x (fp64) above it from its first step (tests/verify/).
MARGIN = 100.0
ULPS = 16  # the loss's own rounding: a sum over the batch in another order, in units of roundoff
UNIT_ROUNDOFF = {"fp64": 2.0 ** -53, "fp32": 2.0 ** -24}
# A bound above this share of the loss tells little: a model that amplifies rounding this far (an
# unstable lr, float32 over many steps) hides what a bug would do. The verdict line says from
# which step that is so.
TELLING = 0.01
# The floor run's nudge, in units of roundoff: at 1 most weights would round back to themselves
# (1 + u x z is 1 for |z| < 1); at 4 nearly all move by one to a few ulps.
NUDGE_ULPS = 4


@dataclass
class StepCheck:
    step: int
    single_loss: float
    strategy_loss: float
    difference: float  # |strategy - single|
    floor: float  # |perturbed single - single|
    bound: float  # what the difference may reach at this step
    ok: bool


@dataclass
class Certificate:
    strategy: str
    world_size: int
    precision: str  # fp64, or fp32 where the strategy cannot train in float64
    why_precision: str  # why this precision (the strategy's reason where it is not fp64)
    steps: list[StepCheck]
    runs: dict = field(default_factory=dict)  # role -> run folder
    margin: float = MARGIN
    dropout: str = ""  # the model's dropout, where it has any (``runs.dropout_of``): a reason to differ

    @property
    def first_bad_step(self) -> int | None:
        return next((c.step for c in self.steps if not c.ok), None)

    @property
    def telling_through(self) -> int:
        """The last step before the first whose bound exceeds ``TELLING`` of the loss (0: none)."""
        k = 0
        for c in self.steps:
            if c.bound > TELLING * abs(c.single_loss):
                break
            k = c.step
        return k

    @property
    def verdict(self) -> str:
        return "equivalent" if self.first_bad_step is None else "differs"

    def verdict_line(self) -> str:
        worst = max(self.steps, key=lambda c: c.difference / c.bound if c.bound else float("inf"))
        where = (f"largest difference {worst.difference:.3g} at step {worst.step}, "
                 f"{worst.difference / worst.bound:.2g}x its bound" if worst.bound else "")
        head = (f"{self.strategy} at world size {self.world_size} ({self.precision}, {len(self.steps)} steps): ")
        if self.telling_through < len(self.steps):
            where += (f"; from step {self.telling_through + 1} the floor passes {TELLING:.0%} of the loss "
                      f"(rounding alone moves this run that far), so later steps tell little")
        if self.verdict == "equivalent":
            return head + f"equivalent to single within the noise floor ({where})"
        if self.dropout:  # not the strategy's doing: say so on the line the user reads
            where += (f"; the model has {self.dropout}, whose masks differ between ranks and one process, so "
                      f"it differs whatever the strategy: set its dropout to 0 to verify the strategy")
        return head + f"differs from step {self.first_bad_step} ({where})"

    def lines(self) -> list[str]:
        """The per-step table and the verdict, as printed."""
        out = [f"{'step':>4}  {'single loss':>14}  {'|strategy - single|':>19}  {'floor':>9}  {'bound':>9}",]
        for c in self.steps:
            out.append(f"{c.step:>4}  {c.single_loss:>14.10f}  {c.difference:>19.3e}  {c.floor:>9.2e}  "
                       f"{c.bound:>9.2e}  {'ok' if c.ok else 'OVER'}")
        out.append(self.verdict_line())
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "verdict": self.verdict, "first_bad_step": self.first_bad_step,
                "telling_through": self.telling_through, "verdict_line": self.verdict_line()}

    def write(self, folder: Path) -> Path:
        path = Path(folder) / "verify.json"
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path


def judge(single: list[float], strategy: list[float], floor: list[float], precision: str,
          margin: float = MARGIN) -> list[StepCheck]:
    """Each step's difference between ``strategy`` and ``single`` against the bound the floor
    (``single`` one rounding error away) sets up to that step."""
    if not (len(single) == len(strategy) == len(floor)):
        raise ValueError(f"runs of unequal length: single {len(single)}, strategy {len(strategy)}, floor {len(floor)}")
    u = UNIT_ROUNDOFF[precision]
    checks, running = [], 0.0
    for k, (s, t, f) in enumerate(zip(single, strategy, floor), start=1):
        running = max(running, abs(f - s))
        bound = margin * running + ULPS * u * abs(s)
        difference = abs(t - s)
        checks.append(StepCheck(k, s, t, difference, abs(f - s), bound, difference <= bound))
    return checks


def read(folder: Path) -> Certificate | None:
    """The certificate a run folder holds (``verify.json``), or None."""
    path = Path(folder) / "verify.json"
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    keep = {k: d[k] for k in ("strategy", "world_size", "precision", "why_precision", "runs", "margin")}
    return Certificate(steps=[StepCheck(**c) for c in d["steps"]], dropout=d.get("dropout", ""), **keep)
