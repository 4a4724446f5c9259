"""``python -m suite.advise RECIPE --nodes N --per-node G [--hardware PROFILE|h100|h200|a100|a100_40gb] [--top K] [--weak-scaling] [--tensor-across-nodes] [--verify K] [--verbose] [key=value ...]``

Searches every strategy and its variants (data x tensor x pipeline degrees, HSDP replicas,
micro-batches, ZeRO stages; activation checkpointing and gradient accumulation where a rank's
memory needs them) for a cluster of N nodes of G ranks, predicts each one's step time and memory
per rank on the hardware profile (each sized as ``suite.plan`` sizes it: one answer for one
configuration), and prints the best K with the recipe overrides to run each, and the
configurations left out, one line per reason with a count (``--verbose``: every one). Tensor
parallelism stays within a node unless ``--tensor-across-nodes``. Where the model fits one device,
it says so, and where the global batch cannot feed the ranks, how many it can and ``--weak-scaling``.
The recipe and its overrides are checked once, before the search: a bad value is one line, exit 2.
``--verify K`` runs the best K for a few steps and prints predicted against measured. ``key=value`` overrides go anywhere on the line.

Hardware: this host's calibration (``python -m suite.calibrate``, once), a calibration file, or
a preset of public hardware (``h100``, ``a100``: from published specs, and every output says so).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from suite.common.errors import SuiteError, one_line
from suite.common.quiet import quiet_libraries


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m suite.advise", description=__doc__.split("\n\n")[1])
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="key.path=value, as suite.submit takes them (anywhere on the line)")
    p.add_argument("--nodes", type=int, default=1, help="nodes in the cluster (default 1)")
    p.add_argument("--per-node", type=int, default=None, help="ranks (devices) per node (default: the recipe's "
                   "launch.tasks_per_node, or the preset's GPUs per node)")
    p.add_argument("--hardware", default=None, help="h100, h200, a100, a100_40gb (presets from specs), or a profile file from "
                   "python -m suite.calibrate --out; default: this host's calibration")
    p.add_argument("--top", type=int, default=5, help="configurations to print (default 5)")
    p.add_argument("--weak-scaling", action="store_true", help="keep the recipe's per-rank batch: the global batch "
                   "grows with the data-parallel degree (default: the recipe's global batch)")
    p.add_argument("--tensor-across-nodes", action="store_true", help="also try tensor-parallel groups that span "
                   "nodes (default: within a node, where their all-reduces inside every layer belong)")
    p.add_argument("--strategies", default="all", help="all, or comma-separated name[:key=value...] as suite.plan")
    p.add_argument("--verify", type=int, default=0, metavar="K", help="run the best K for --verify-steps steps and "
                   "print predicted against measured")
    p.add_argument("--verify-steps", type=int, default=20)
    p.add_argument("--runs", default="runs", help="the run records whose predicted and measured step times say how "
                   "far apart two predictions must be to be ordered (default: runs/, as suite.submit writes them)")
    p.add_argument("--out", default="runs/advise", help="folder for advice.md, advice.csv and the verify runs")
    p.add_argument("--verbose", action="store_true", help="show library warnings, and every configuration left out "
                   "(default: one line per reason, with a count)")
    return p.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.verbose:
        quiet_libraries()
    return one_line(_run, args)


def _run(args) -> int:
    from suite.advise import output
    from suite.planner import hardware, search, table
    from suite.recipe.text import raw_points

    if args.nodes < 1 or (args.per_node is not None and args.per_node < 1) or args.top < 1 or args.verify < 0:
        raise SuiteError("--nodes, --per-node and --top must be at least 1, --verify at least 0")
    points = raw_points(args.recipe, args.overrides)
    if len(points) != 1:
        raise SuiteError(f"{args.recipe} sweeps {len(points)} points; the advisor advises one: drop the sweep or "
                         f"fix its keys with key=value")
    raw = points[0]
    search.check_recipe(raw)  # a bad key=value: one line now, not once per candidate
    profile = hardware.load(args.hardware, backend=None)
    if profile is None:
        raise SuiteError("no calibration of this host: run python -m suite.calibrate once (about a minute), or "
                         "plan on a preset: --hardware h100 or --hardware a100")
    per_node = args.per_node or profile.get("per_node") or int((raw.get("launch") or {}).get("tasks_per_node", 1))
    memory, memory_what = output.memory_per_rank(profile, raw, per_node)
    specs = None if args.strategies == "all" else table.strategy_specs(args.strategies, raw.get("strategy") or {})
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731 - progress on stderr
    say(f"advise: {args.nodes} node(s) x {per_node} rank(s) on {hardware.describe(profile)}")
    device = "cuda" if profile.get("from_specs") else None
    candidates = search.search(raw, args.nodes, per_node, profile, memory, args.weak_scaling, specs, progress=say,
                               device=device, tensor_across_nodes=args.tensor_across_nodes)
    single = search.one_device(raw, memory, device, progress=say) if args.nodes * per_node > 1 else None
    text = output.write(candidates, raw, profile, args, per_node, memory_what, Path(args.out), single)
    print(text)
    fitting = [c for c in candidates if not c.excluded]
    if args.verify and fitting:
        from suite.advise import verify

        print(verify.run(fitting[:args.verify], raw, args.verify_steps, Path(args.out), say))
    return 0 if fitting else 1


if __name__ == "__main__":
    from suite.common.exit import run_command

    run_command(main)
