"""Command line: validate a recipe, launch its run(s) through submitit, follow them, summarise.

    python -m suite.submit RECIPE [key.path=value ...] [--dry-run] [--out DIR] [--executor E] [--no-wait]

Exit codes: 0 every run completed; 1 a run failed; 2 bad input (recipe, world size, data).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

from suite.common.errors import RunFailed, SuiteError
from suite.compat import untested_line
from suite.record import console, run_record
from suite.submit import resume
from suite.submit.restart import Restarts
import datetime


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m suite.submit",
                                description="Run a recipe (or each point of its sweep) through submitit.")
    p.add_argument("recipe", nargs="?", help="recipe YAML, e.g. recipes/quickstart.yaml")
    p.add_argument("overrides", nargs="*", help="key.path=value, e.g. training.epochs=3 strategy.name=single")
    p.add_argument("--dry-run", action="store_true", help="validate and print the jobs, train nothing")
    p.add_argument("--out", default="runs", help="folder for run records (default: runs/)")
    p.add_argument("--executor", choices=["local", "slurm", "debug", "mpi"], help="overrides launch.executor")
    p.add_argument("--no-wait", action="store_true", help="return after submitting")
    p.add_argument("--force", action="store_true", help="launch even if the predicted bytes exceed the node's memory")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a stopped, cancelled or failed run from its last checkpoint; strategy.* and "
                        "launch.* overrides resume it under another strategy or world size where its checkpoint allows")
    args = p.parse_intermixed_args(argv)
    if args.resume and args.recipe and "=" in args.recipe:  # --resume RUN strategy.name=fsdp: all overrides
        args.recipe, args.overrides = None, [args.recipe, *args.overrides]
    if bool(args.recipe) == bool(args.resume):
        p.error("give a recipe, or --resume RUN_DIR (not both)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if note := untested_line():  # a library outside the tested set: said once, never replaced
        print(note, file=sys.stderr)
    try:
        return _main(args)
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: say so in one line, keep the traceback in a file
        with tempfile.NamedTemporaryFile("w", prefix="scalesuite-crash-", suffix=".txt", delete=False) as f:
            traceback.print_exc(file=f)
        print(f"error: internal error {type(e).__name__}: {e} (traceback: {f.name}; please report it)",
              file=sys.stderr)
        return 1


def _main(args) -> int:
    from suite.submit import pool as pools, preflight

    if args.resume:
        return _resume(args)

    overrides = list(args.overrides) + ([f"launch.executor={args.executor}"] if args.executor else [])
    # A local run's ranks start now and warm up (torch, ...) while the recipe is checked below.
    pool = None if args.dry_run or args.no_wait else pools.prestart(args.recipe, overrides, Path(args.out))
    try:
        from suite import recipe as recipes  # after the warm pool started: its ranks warm up meanwhile

        points = recipes.load(args.recipe, overrides)
        estimates = preflight.check(points, Path(args.out), force=args.force, dry_run=args.dry_run)  # data, device, memory, Slurm
    except BaseException:
        if pool:
            pool.discard()
        raise
    if args.dry_run:
        for r, est in zip(points, estimates):
            print(recipes.dump(r).rstrip())
            print(console.job_line(r))
            print(_estimate_text(est))
            print(_predicted_text(r))
            print("---")
        print(f"{len(points)} job(s); nothing launched (--dry-run)")
        return 0
    out = Path(args.out)
    if pool and not (points[0].launch.executor == "local" and pool.takes(points[0])
                     and pool.home.name.startswith(f"{points[0].name}-")):
        pool.discard()  # the guess from the recipe text was wrong: a pool is started for what it says
        pool = None
    runs = [(r, run_record.new_run_dir(r.name, recipes.dump(r), out)) for r in points[1 if pool else 0:]]
    if pool:  # the first point's run folder is the one the pool was started in
        (pool.home / "recipe.yaml").write_text(recipes.dump(points[0]))
        runs.insert(0, (points[0], pool.home))
    return _run_all(runs, out, wait=not args.no_wait, pool=pool)


def _predicted_text(recipe) -> str:
    from suite.planner.predict import prediction

    p = prediction(recipe)
    if "error" in p:
        return f"  predicted step time: not predicted ({p['error']})"
    peak = (f"  predicted peak memory per rank {p['peak_bytes'] / 2**20:.1f} MiB allocated (held bytes, the "
            f"strategy's buffers, activations or the optimizer's temporaries)"
            + (f", {p['reserved_bytes'] / 2**20:.1f} MiB reserved by the CUDA caching allocator"
               if p.get("reserved_bytes") else "") + "\n") if p.get("peak_bytes") else ""
    if p.get("step_time_s") is None:
        return f"{peak}  predicted step time: not predicted ({'; '.join(p['notes'])})"
    busy = "".join(f"\n  note: {p[k]}" for k in ("calibration_busy_note", "calibration_speed_note") if p.get(k))
    return (f"{peak}  predicted step time {p['step_time_s'] * 1e3:.1f} ms ({p['samples_per_s']:.0f} samples/s; "
            f"compute {p['compute_s'] * 1e3:.1f} ms, communication {p['comm_s'] * 1e3:.1f} ms of which "
            f"{p['exposed_comm_s'] * 1e3:.1f} ms exposed; {p['source']} profile){busy}")


def _requeue_wait_s(recipe) -> float | None:
    """How long the follower lets a job that Slurm requeued after a node failure pend before it
    restarts the run without the node (launch.elastic), or None: Slurm reruns it when it can."""
    return recipe.launch.elastic_wait_s if recipe.launch.elastic else None


def _resume(args) -> int:
    """Launch a run again into its own folder; its ranks resume from the last checkpoint."""
    run_dir = Path(args.resume).resolve()
    if not (run_dir / "recipe.yaml").is_file():
        raise SuiteError(f"--resume {args.resume}: no run record there (expected {run_dir / 'recipe.yaml'}); "
                         f"give a run folder that suite.submit wrote, e.g. runs/<name>-<time>-<id>")
    resume.check_overrides(args.resume, args.overrides)  # strategy.* and launch.* only
    status = run_record.summary_so_far(run_dir).get("status")
    if status == "completed":
        raise SuiteError(f"--resume {args.resume}: the run has completed; nothing to resume")
    from suite.record.status import state

    if state(run_dir)["state"] == "running":
        raise SuiteError(f"--resume {args.resume}: the run is still running (see python -m suite.status {args.resume})")
    overrides = [f"launch.executor={args.executor}"] if args.executor else []
    from suite import recipe as recipes

    (before,) = recipes.load(run_dir / "recipe.yaml")
    (recipe,) = recipes.load(run_dir / "recipe.yaml", list(args.overrides) + overrides)
    saved = run_record.latest_checkpoint(run_dir)
    resume.check_conversion(args.resume, before, recipe, saved)  # refused here, before any rank starts
    if args.overrides:  # the run goes on as this: later resumes, restarts and exports read it
        (run_dir / "recipe.yaml").write_text(recipes.dump(recipe))
        print(f"resuming as strategy {recipe.strategy.name} at world size {recipe.world_size} (was "
              f"{before.strategy.name} at {before.world_size})", flush=True)
    print(f"resuming {run_dir.name} from " + (f"its checkpoint at step {saved['step']}" if saved
                                              else "the start (it has no checkpoint)"), flush=True)
    run_record.archive_errors(run_dir)
    return _run_all([(recipe, run_dir)], run_dir.parent, wait=not args.no_wait)


def _run_all(runs, out: Path, wait: bool, pool=None) -> int:

    from suite.submit import follow, launch

    points = [r for r, _ in runs]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    failures = 0
    restarts = {Path(run_dir): Restarts(r, run_dir) for r, run_dir in runs}  # launch.max_restarts, per run

    def done(w, resubmit):
        """A run has ended: its summary, or its error; or, when a rank died and the run has
        restarts left, the Watch of the run submitted again (``resubmit(restart)``)."""
        nonlocal failures
        try:
            summary = w.outcome()
        except RunFailed as e:
            budget = restarts[Path(w.run_dir)]
            restart = budget.next(w, e)
            if restart is not None:
                return resubmit(restart)
            print(f"error: {budget.gave_up(e)}", file=sys.stderr, flush=True)
            failures += 1
            return None
        print(console.summary_text(summary, w.run_dir), flush=True)
        return None

    if points[0].launch.executor == "local" and wait:
        _run_pooled(runs, pool, done)
        return 1 if failures else 0
    if points[0].launch.executor == "mpi" and wait and len(runs) > 1:  # one after another, as local points
        return max(_run_all([run], out, wait) for run in runs)
    jobs = launch.submit(runs, out / f"sweep-{stamp}-submitit", watched=wait)
    watches = []
    for (r, run_dir), job in zip(runs, jobs):
        run_record.record_job(run_dir, job.job_id, r.launch.executor)
        print(f"{console.job_line(r)}\n  job {job.job_id}, run record: {run_dir}", flush=True)
        watches.append(follow.Watch(job, run_dir, r.training.epochs, requeue_wait_s=_requeue_wait_s(r)))

    def resubmit_job(w):
        def resubmit(restart):  # the run alone, as --resume submits it (a sweep's point leaves its array)
            (job,) = launch.submit([(restart.recipe, w.run_dir)], watched=True)
            run_record.record_job(w.run_dir, job.job_id, restart.recipe.launch.executor)
            print(f"  job {job.job_id}, run record: {w.run_dir}", flush=True)
            return follow.Watch(job, w.run_dir, restart.recipe.training.epochs,
                                requeue_wait_s=_requeue_wait_s(restart.recipe))
        return resubmit

    if wait:
        follow.wait(watches, on_done=lambda w: done(w, resubmit_job(w)))
    else:
        print("submitted; not waiting (--no-wait). Follow with: squeue / the run folders above")
    return 1 if failures else 0


def _run_pooled(runs, pool, done) -> None:
    """Local runs, one after another (they would compete for the machine's cores), in warm ranks
    (``suite.submit.pool``): a pool serves points while it can, a new one takes over when not.
    A run restarted after a rank died (``launch.max_restarts``) gets a new pool, as ``--resume``."""
    from suite.submit import follow
    from suite.submit.pool import Pool, target_modules

    held = [pool]  # the pool serving now

    def follow_in_pool(n, r, run_dir):
        pool = held[0]
        if pool is None or not pool.takes(r):
            if pool:
                pool.close()
            rest = [p for p, _ in runs[n:]]
            pool = held[0] = Pool.start(run_dir, [p.launch for p in rest], [p.strategy.name for p in rest],
                                        target_modules([p.model_dump(mode="json") for p in rest]))
        index = pool.hand_over(r, run_dir)
        run_record.record_job(run_dir, pool.job.job_id, r.launch.executor)
        print(f"{console.job_line(r)}\n  job {pool.job.job_id}, run record: {run_dir}", flush=True)
        return follow.PoolWatch(pool, index, run_dir, r.training.epochs)

    def resubmit_in_new_pool(n, run_dir):
        def resubmit(restart):
            held[0].open = False  # its ranks have ended (or were killed)
            return follow_in_pool(n, restart.recipe, run_dir)
        return resubmit

    try:
        for n, (r, run_dir) in enumerate(runs):
            watch = follow_in_pool(n, r, run_dir)
            follow.wait([watch], poll_s=0.05, on_done=lambda w: done(w, resubmit_in_new_pool(n, run_dir)))
            if run_record.summary_so_far(run_dir).get("status") != "completed":
                held[0].open = False  # its ranks have ended (or were killed): the next point gets new ones
    finally:
        if held[0]:
            held[0].close()


def _mb(n) -> str:
    return f"{n / 2**20:.2f} MiB"


def _estimate_text(est) -> str:
    t, p = est["total"], est["per_rank"]
    keys = ("parameters", "gradients", "optimizer_state")
    return (f"  predicted bytes ({est['parameters_count']:,} parameters): "
            + ", ".join(f"{k} {_mb(p[k])} per rank of {_mb(t[k])}" for k in keys))


if __name__ == "__main__":
    sys.exit(main())
