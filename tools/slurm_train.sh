#!/usr/bin/env bash
# Train on a Slurm cluster: one task per GPU, MMEngine's slurm launcher (DDP),
# auto-resume from the newest checkpoint of WORK_DIR that loads, and requeue
# after a preemption checkpoint (README: "Training on clusters").
#
#   bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [GPUS] [train.py args...]
#
# GPUS (default 8, or $GPUS) is the number of tasks; environment:
#   GPUS_PER_NODE   tasks and GPUs per node (default: min(GPUS, 8))
#   CPUS_PER_TASK   default 5
#   SRUN_ARGS       further srun options, e.g. "--time=24:00:00 --qos=low"
#   SIGNAL          what Slurm sends SIGNAL_TIME s before the time limit
#                   (srun --signal), default USR1 (tools/train.py saves
#                   iter_N.pth on SIGTERM and SIGUSR1 and exits with 75)
#   SIGNAL_TIME     default 120
#   MAX_REQUEUES    how often to start again after exit status 75 (default 20)
#   PYTHON          default: the repository's .venv/bin/python when it
#                   exists (make demo / make test create it), else python
#
# Exit status 75 of tools/train.py means "checkpoint saved, continue later".
# Inside a batch job (sbatch --requeue ... this script) the job is requeued
# with `scontrol requeue $SLURM_JOB_ID`; started from a login node, srun is
# run again (a new allocation) with the same arguments; either way
# tools/train.py --resume continues from that checkpoint.
set -u
DIR="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tools/slurm_args.sh
source "$DIR/slurm_args.sh"
slurm_parse_args WORK_DIR train.py "$@" || exit 2
WORK_DIR=$ARG4
SIGNAL=${SIGNAL:-USR1}
SIGNAL_TIME=${SIGNAL_TIME:-120}
MAX_REQUEUES=${MAX_REQUEUES:-20}
PREEMPTED=75

attempt=0
while true; do
    # SRUN_ARGS unquoted on purpose: several options in one variable
    # shellcheck disable=SC2086
    srun "${SRUN_OPTS[@]}" --signal="$SIGNAL@$SIGNAL_TIME" ${SRUN_ARGS:-} \
        "$PYTHON" -u "$DIR/train.py" "$CONFIG" --work-dir="$WORK_DIR" \
        --launcher=slurm --resume "${TOOL_ARGS[@]}"
    status=$?
    if [ "$status" -ne "$PREEMPTED" ]; then
        exit "$status"
    fi
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        echo "[slurm_train] preempted (status $PREEMPTED): requeueing batch job $SLURM_JOB_ID" >&2
        scontrol requeue "$SLURM_JOB_ID"
        exit "$PREEMPTED"
    fi
    attempt=$((attempt + 1))
    if [ "$attempt" -gt "$MAX_REQUEUES" ]; then
        echo "[slurm_train] preempted $attempt times, more than MAX_REQUEUES=$MAX_REQUEUES: stopping; run again to resume" >&2
        exit "$PREEMPTED"
    fi
    echo "[slurm_train] preempted (status $PREEMPTED): starting again ($attempt/$MAX_REQUEUES), resuming from $WORK_DIR" >&2
done
