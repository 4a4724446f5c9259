"""How far two measurements of the same predict runs agree with each other: the floor under the
predict targets on this machine. A prediction cannot agree with a measurement better than a second
measurement of the same configuration does.

    python benchmarks/measurement_noise.py BENCH_A BENCH_B    (two compare.py --out folders with a predict section)

For every run folder both hold (same model, strategy and world): |A / B - 1| (median and 90th
percentile, as the targets are stated), and per model and world the Kendall tau between A's
measured order of strategies and B's.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def measured(bench_out: Path) -> dict[str, float]:
    """{run folder name: measured step time} of a predict section's completed runs."""
    out = {}
    for path in sorted(bench_out.glob("predict/*/*/summary.json")):
        step = json.loads(path.read_text()).get("step_time_s")
        if step:
            out[path.parent.parent.name] = step
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = p.parse_args()
    from sections.predict import kendall_tau, percentile

    a, b = measured(args.a), measured(args.b)
    both = sorted(set(a) & set(b))
    if len(both) < 2:
        sys.exit(f"{args.a} and {args.b} share {len(both)} measured run(s); run the same configurations in both")
    gaps = [abs(a[name] / b[name] - 1) for name in both]
    print(f"{len(both)} runs measured twice: |A/B - 1| median {percentile(gaps, 0.5):.0%}, p90 {percentile(gaps, 0.9):.0%}")
    groups: dict = {}
    for name in both:
        model, world = name.split("-", 1)[0], name.rsplit("-", 1)[1]
        groups.setdefault(f"{model}-{world}", []).append((a[name], b[name]))
    taus = {key: kendall_tau([x for x, _ in v], [y for _, y in v]) for key, v in groups.items() if len(v) > 1}
    print("Kendall tau, measured against measured: " + ", ".join(f"{k} {t:.2f}" for k, t in sorted(taus.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
