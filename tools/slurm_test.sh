#!/usr/bin/env bash
# Test a checkpoint on a Slurm cluster: one task per GPU, MMEngine's slurm
# launcher.
#
#   bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [GPUS] [test.py args...]
#
# GPUS (default 8, or $GPUS) is the number of tasks; environment:
# GPUS_PER_NODE (default: min(GPUS, 8)), CPUS_PER_TASK (5), SRUN_ARGS (further
# srun options), PYTHON (python).
set -u
if [ $# -lt 4 ]; then
    echo "usage: $0 PARTITION JOB_NAME CONFIG CHECKPOINT [GPUS] [test.py args...]" >&2
    exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
shift 4
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then
    GPUS=$1
    shift
else
    GPUS=${GPUS:-8}
fi
GPUS_PER_NODE=${GPUS_PER_NODE:-$((GPUS < 8 ? GPUS : 8))}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-""}
PYTHON=${PYTHON:-python}
DIR="$(cd "$(dirname "$0")" && pwd)"
export PYTHONPATH="$DIR/..${PYTHONPATH:+:$PYTHONPATH}"

# shellcheck disable=SC2086
exec srun -p "$PARTITION" \
    --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" \
    --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 \
    $SRUN_ARGS \
    "$PYTHON" -u "$DIR/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm "$@"
