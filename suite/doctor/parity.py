"""The parity smoke: ddp, fsdp and zero2 train a small MLP on synthetic data for a few steps,
each held to ``single`` by ``suite.verify.certify_each``: it runs the strategies, single and single's
noise floor (one rounding error away) through ``suite.submit`` and judges each step's difference
against that floor, in float64 where the strategy can train in it (DeepSpeed's ZeRO keeps float32
master weights: float32, said on its certificate). A "differs" is then a real difference: the
strategy trains wrongly on this stack."""
from __future__ import annotations

from pathlib import Path

from suite.doctor.report import Check

STRATEGIES = {"ddp": {"name": "ddp"}, "fsdp": {"name": "fsdp"}, "zero2": {"name": "zero", "stage": 2}}
QUICK = ("ddp",)  # --quick: a certificate is three runs (two submits), ~20 s on 2 cores; ddp alone shows the stack works


def recipe_for(strategy: dict, world: int, device: str) -> dict:
    """The raw recipe: an MLP on 8x8 synthetic images, 8 samples per rank per step (certify cuts
    it to its steps and picks the precision)."""
    return {
        "name": f"doctor-{strategy['name']}",
        "model": {"name": "mlp", "hidden": [32, 32]},
        "data": {"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 256, "n_val": 32},
        "strategy": strategy,
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
        "training": {"batch_size": 8 * world, "seed": 0},
        "launch": {"executor": "local", "tasks_per_node": world, "device": device},
        "tracking": {"wandb": "disabled"},
    }


def certify_function():
    """``suite.verify.certify_each``, or None where this installation does not have it."""
    try:
        from suite.verify import certify_each  # optional: an installation may lack suite.verify
    except ModuleNotFoundError as e:
        if e.name != "suite.verify":
            raise  # suite.verify is there but something it imports is not: that is a finding, not a skip
        return None
    return certify_each


def _one_line(text: str, keep: int = 3) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return " | ".join(lines[:1] + lines[1:][-keep:])


def parity_smoke(world: int, steps: int, out: Path, device: str, emit, line, labels=tuple(STRATEGIES),
                 certify=None) -> dict:
    """One check per strategy of ``labels``: its certificate against single, all certified at
    once (``certify_each``: one single and one floor run per precision serve them all, and the
    strategies that share a precision run as one sweep). ``certify`` defaults to
    ``suite.verify.certify_each``; without it the smoke is one skipped check saying so."""
    from suite import recipe as recipes
    from suite.common.errors import SuiteError

    certify = certify or certify_function()
    if certify is None:
        emit(Check("parity", "skip", "suite.verify (certify) is not in this installation, so "
                                     f"{', '.join(labels)} were not compared with single"))
        return {"skipped": "suite.verify missing"}
    outcomes, chosen = {}, []
    for label in labels:
        try:
            chosen.append((label, recipes.validate(recipe_for(STRATEGIES[label], world, device))))
        except SuiteError as e:
            outcomes[label] = e
    if chosen:
        got = certify([recipe for _, recipe in chosen], steps, Path(out), lambda text: line(f"    {text}"))
        outcomes.update(zip((label for label, _ in chosen), got))
    found = {}
    for label in labels:
        name = f"parity {label} vs single x{world}"
        cert = outcomes[label]
        if isinstance(cert, SuiteError):
            emit(Check(name, "fail", f"did not run: {_one_line(cert)}",
                       meaning=f"{label} does not train on this stack: the message names why",
                       fix=f"fix what it names; if it is the suite's fault, report it with {out}"))
            found[label] = {"error": str(cert), "folder": str(out)}
            continue
        folder = cert.runs["strategy"]
        lines = list(cert.lines())
        found[label] = {"verdict": cert.verdict, "first_bad_step": cert.first_bad_step, "folder": str(folder),
                        "lines": lines}
        if cert.verdict == "equivalent":
            emit(Check(name, "pass", lines[-1]))
            continue
        bad = next((ln for ln in lines if ln.split()[:1] == [str(cert.first_bad_step)]), "")
        emit(Check(name, "fail", f"{lines[-1]}; step {bad.strip()}",
                   meaning=f"{label} trains differently from single on this stack (this torch, "
                           f"{'NCCL' if device == 'cuda' else 'gloo'}, this hardware): a strategy bug here",
                   fix=f"report it with the certificate and runs in {folder}", data=found[label]))
    return found
