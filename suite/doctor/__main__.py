"""``python -m suite.doctor [--ranks N] [--quick] [--json FILE] [--timeout S] [--out DIR]``:
check a new machine or cluster before a study (``suite.doctor``). Exit 0 when every check
passes, 1 when any fails, 2 on bad usage."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from suite.common.errors import SuiteError, one_line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.doctor", description="Check a new machine or cluster before a study.")
    p.add_argument("--ranks", type=int, default=2, help="local ranks for the collectives and the parity smoke (default 2)")
    p.add_argument("--quick", action="store_true", help="messages 1 KiB .. 4 MiB, fewer calls, parity of ddp only (default: .. 64 MiB; ddp, fsdp, zero2)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds one message size of one collective may take before it counts as hung (default 60)")
    p.add_argument("--json", type=Path, help="also write the result as JSON here")
    p.add_argument("--out", type=Path, help="folder for the parity certificates (default: a new temporary folder)")
    args = p.parse_args(argv)
    return one_line(_run, args)


def _run(args) -> int:
    if args.ranks < 2:
        raise SuiteError(f"--ranks {args.ranks}: collectives need at least 2 ranks; use --ranks 2")
    if args.timeout <= 0:
        raise SuiteError(f"--timeout {args.timeout:g}: give a positive number of seconds, e.g. --timeout 60")
    if args.json and args.json.is_dir():
        raise SuiteError(f"--json {args.json} is a folder; name a file, e.g. --json {args.json / 'doctor.json'}")
    from suite.doctor import checkup
    from suite.doctor.report import exit_code, write_json

    try:
        up = checkup.run(checkup.CheckupSpec(ranks=args.ranks, quick=args.quick, timeout_s=args.timeout, out=args.out))
    except KeyboardInterrupt:  # the ranks are killed on the way out (suite.doctor.ranks)
        print("interrupted", file=sys.stderr)
        return 130
    if args.json:
        write_json(args.json, up.facts, up.checks)
        print(f"wrote {args.json}", flush=True)
    return exit_code(up.checks)


if __name__ == "__main__":
    from suite.common.exit import run_command

    run_command(main)
