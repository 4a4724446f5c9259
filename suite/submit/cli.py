"""Command line: validate a recipe, launch its run(s) through submitit, follow them, summarise.

    python -m suite.submit RECIPE [key.path=value ...] [--dry-run] [--out DIR] [--executor E] [--no-wait]

Exit codes: 0 every run completed; 1 a run failed; 2 bad input (recipe, world size, data).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from suite import recipe as recipes
from suite.errors import RunFailed, SuiteError
from suite.record import run_record


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m suite.submit",
                                description="Run a recipe (or each point of its sweep) through submitit.")
    p.add_argument("recipe", help="recipe YAML, e.g. recipes/quickstart.yaml")
    p.add_argument("overrides", nargs="*", help="key.path=value, e.g. training.epochs=3 strategy.name=single")
    p.add_argument("--dry-run", action="store_true", help="validate and print the jobs, train nothing")
    p.add_argument("--out", default="runs", help="folder for run records (default: runs/)")
    p.add_argument("--executor", choices=["local", "slurm", "debug"], help="overrides launch.executor")
    p.add_argument("--no-wait", action="store_true", help="return after submitting")
    return p.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return _main(args)
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: say so in one line, keep the traceback in a file
        import tempfile
        import traceback

        with tempfile.NamedTemporaryFile("w", prefix="scalesuite-crash-", suffix=".txt", delete=False) as f:
            traceback.print_exc(file=f)
        print(f"error: internal error {type(e).__name__}: {e} (traceback: {f.name}; please report it)",
              file=sys.stderr)
        return 1


def _main(args) -> int:
    from suite.estimate import predicted_held_bytes

    overrides = list(args.overrides) + ([f"launch.executor={args.executor}"] if args.executor else [])
    points = recipes.load(args.recipe, overrides)
    estimates = []
    for r in points:
        r.data.check_available()
        estimates.append(predicted_held_bytes(r))  # also builds the model on meta: catches shape errors
    if args.dry_run:
        for r, est in zip(points, estimates):
            print(recipes.dump(r).rstrip())
            print(run_record.job_line(r))
            print(_estimate_text(est))
            print("---")
        print(f"{len(points)} job(s); nothing launched (--dry-run)")
        return 0
    return _run_all(points, Path(args.out), wait=not args.no_wait)


def _run_all(points, out: Path, wait: bool) -> int:
    import datetime

    from suite.submit import follow, launch

    runs = [(r, run_record.new_run_dir(r.name, recipes.dump(r), out)) for r in points]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    if points[0].launch.executor == "local" and wait:
        # One machine: run the points one after another, so they do not compete for its cores.
        batches = [[run] for run in runs]
    else:
        batches = [runs]
    failures = 0

    def done(w):
        nonlocal failures
        try:
            summary = w.outcome()
        except RunFailed as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            failures += 1
            return
        print(run_record.summary_text(summary, w.run_dir), flush=True)

    for batch in batches:
        jobs = launch.submit(batch, out / f"sweep-{stamp}-submitit")
        watches = []
        for (r, run_dir), job in zip(batch, jobs):
            print(f"{run_record.job_line(r)}\n  job {job.job_id}, run record: {run_dir}", flush=True)
            watches.append(follow.Watch(job, run_dir, r.training.epochs))
        if wait:
            follow.wait(watches, on_done=done)
    if not wait:
        print("submitted; not waiting (--no-wait). Follow with: squeue / the run folders above")
    return 1 if failures else 0


def _mb(n) -> str:
    return f"{n / 2**20:.2f} MiB"


def _estimate_text(est) -> str:
    t, p = est["total"], est["per_rank"]
    keys = ("parameters", "gradients", "optimizer_state")
    return (f"  predicted bytes ({est['parameters_count']:,} parameters): "
            + ", ".join(f"{k} {_mb(p[k])} per rank of {_mb(t[k])}" for k in keys))


if __name__ == "__main__":
    sys.exit(main())
