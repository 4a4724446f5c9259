#!/usr/bin/env bash
# The link study (recipes/studies/links.yaml) over several link rates of the local Slurm:
# for each rate, restart the cluster with its nodes behind links of that rate (start.sh --link),
# calibrate those links under Slurm on both nodes (the runs' predicted step times come from it),
# run the study, then draw throughput and scaling efficiency against link rate (analysis.links).
# The plain cluster (no --link) is started again at the end, also after a failure.
# Usage: slurm/link_study.sh [--rates 10gbit,1gbit,100mbit] [--out DIR] [--arms A,B] [--max-bytes N] [key=value ...]
#   --max-bytes: the calibration's largest message (default 4 MiB: at 100 Mbit/s larger ones take seconds each)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
RATES=10gbit,1gbit,100mbit
OUT=studies/links-$(date +%Y%m%d-%H%M%S)
ARMS=()
MAX_BYTES=$((4 * 2**20))
OVERRIDES=()
while [ $# -gt 0 ]; do
  case $1 in
    --rates) RATES=${2:-}; shift 2 ;;
    --out) OUT=${2:-}; shift 2 ;;
    --arms) ARMS=(--arms "${2:-}"); shift 2 ;;
    --max-bytes) MAX_BYTES=${2:-}; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *=*) OVERRIDES+=("$1"); shift ;;
    *) echo "link_study: unknown argument '$1' (accepted: --rates, --out, --arms, --max-bytes, key=value)" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a rates <<<"$RATES"
for rate in "${rates[@]}"; do
  case $rate in 10gbit|1gbit|100mbit) ;; *) echo "link_study: rate '$rate' is not one of 10gbit, 1gbit, 100mbit" >&2; exit 2 ;; esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
restore() { bash slurm/stop.sh >/dev/null 2>&1 || true; bash slurm/start.sh >/dev/null 2>&1 || echo "link_study: the plain cluster did not start again: bash slurm/start.sh" >&2; }
trap restore EXIT
code=0
for rate in "${rates[@]}"; do
  echo "== link $rate: cluster, calibration, study =="
  bash slurm/stop.sh >/dev/null
  bash slurm/start.sh --link "$rate"
  mkdir -p "$OUT/$rate"
  # each rate's calibration in its own cache, so that a run finds the one of its links
  export XDG_CACHE_HOME="$OUT/$rate/cache"
  python -m suite.calibrate recipes/quickstart.yaml launch.executor=slurm launch.nodes=2 launch.tasks_per_node=1 \
    --max-bytes "$MAX_BYTES" --out "$OUT/$rate/calibration.json" | tail -8
  python -m suite.study recipes/studies/links.yaml "${ARMS[@]}" --out "$OUT/$rate" "${OVERRIDES[@]}" || code=$?
done
unset XDG_CACHE_HOME
python -m analysis.links "$OUT" || code=$?
exit "$code"
