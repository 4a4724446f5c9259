#!/usr/bin/env bash
# One prepared check of the CUDA paths, for the minutes a GPU machine is lent (<= 10 min on one
# GPU): suite.doctor with NCCL, a GPU calibration kept as a hardware profile, every strategy that
# runs on G GPUs certified by suite.verify on CUDA (float64/float32 against single), every one 20
# steps in bf16 and in fp16 (loss-scaled: its skipped steps), each measured beside its predicted
# peak memory and step time; all in one results file, benchmarks/results/<date>-gpu-<card>.md.
#
#   bash benchmarks/gpu_check.sh [--dry-run] [--gpus G] [--out DIR]
#
# --dry-run lists every check it would run, one per line, and runs nothing (no GPU needed).
# A check that fails or times out is recorded with its exit code and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
GPUS=""
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --gpus) GPUS="$2"; shift ;;
        --out) OUT="$2"; shift ;;
        *) echo "error: unknown option $1; use --dry-run, --gpus G or --out DIR" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$GPUS" ]; then
    if [ "$DRY" = 1 ]; then GPUS=1; else GPUS=$(python -c "import torch; print(torch.cuda.device_count())"); fi
fi
if [ "$DRY" = 0 ] && [ "$GPUS" -lt 1 ]; then
    echo "error: no CUDA GPU visible (torch.cuda.device_count() is 0); run this on a GPU machine, or --dry-run" >&2
    exit 2
fi
OUT=${OUT:-runs/gpu-check-$(date +%Y-%m-%d-%H%M)}
RECIPE=recipes/quickstart.yaml
LAUNCH="launch.device=cuda launch.tasks_per_node=$GPUS launch.nodes=1"
STEPS="training.epochs=20 training.max_steps=20"

# The strategies that run on G GPUs of one node: data parallel and ZeRO at any G; tensor and the
# pipelines need two ranks or more. fp16: pipeline and tensor refuse it (their steps cannot scale).
# (JSON, which is YAML without spaces: each command splits into its words at spaces.)
STRATEGIES='{"name":"ddp"},{"name":"allreduce"},{"name":"fsdp"},{"name":"fsdp1"},{"name":"oss"},{"name":"zero","stage":1},{"name":"zero","stage":2},{"name":"zero","stage":3}'
VERIFY="ddp,allreduce,fsdp,fsdp1,oss,zero:stage=1,zero:stage=2,zero:stage=3"
if [ "$GPUS" -ge 2 ]; then
    STRATEGIES="$STRATEGIES,{\"name\":\"ds_pipeline\",\"stages\":$GPUS}"
    VERIFY="$VERIFY,tensor:tp=$GPUS,pipeline:stages=$GPUS,ds_pipeline:stages=$GPUS"
    BF16_ONLY=",{\"name\":\"tensor\",\"tp\":$GPUS},{\"name\":\"pipeline\",\"stages\":$GPUS}"
else
    BF16_ONLY=""
    STRATEGIES='{"name":"single"},'"$STRATEGIES"  # one rank: single too (it needs world size 1)
fi

CHECKS=(
    "doctor|90|python -m suite.doctor --quick --ranks $GPUS --json $OUT/doctor.json --timeout 60"
    "calibrate|90|python -m suite.calibrate $RECIPE $LAUNCH --max-bytes 67108864 --out $OUT/hardware-profile.json"
    "verify|180|python -m suite.verify $RECIPE $LAUNCH --strategies $VERIFY --steps 20 --out $OUT/verify"
    "bf16|120|python -m suite.submit $RECIPE $LAUNCH $STEPS training.precision=bf16 sweep.strategy=[$STRATEGIES$BF16_ONLY] --out $OUT/bf16"
    "fp16|120|python -m suite.submit $RECIPE $LAUNCH $STEPS training.precision=fp16 sweep.strategy=[$STRATEGIES] --out $OUT/fp16"
)

if [ "$DRY" = 1 ]; then
    for check in "${CHECKS[@]}"; do
        IFS='|' read -r name limit command <<< "$check"
        set -f
        read -r -a words <<< "$command"
        set +f
        printf '%s (at most %s s):' "$name" "$limit"
        printf ' %q' "${words[@]}"  # quoted as a shell takes it: each line can be pasted
        printf '\n'
    done
    echo "report: python benchmarks/gpu_check_report.py $OUT --results benchmarks/results"
    exit 0
fi

mkdir -p "$OUT"
: > "$OUT/checks.tsv"
for check in "${CHECKS[@]}"; do
    IFS='|' read -r name limit command <<< "$check"
    echo "== $name: $command"
    start=$(date +%s)
    # word splitting is wanted (the command line), but not globbing of the sweep's brackets
    set -f
    timeout "$limit" $command > "$OUT/$name.log" 2>&1
    code=$?
    set +f
    echo -e "$name\t$code\t$(( $(date +%s) - start ))\t$command" >> "$OUT/checks.tsv"
    tail -n 3 "$OUT/$name.log"
done
python benchmarks/gpu_check_report.py "$OUT" --results benchmarks/results
