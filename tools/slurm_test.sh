#!/usr/bin/env bash
# Test a checkpoint on a Slurm cluster: one task per GPU, MMEngine's slurm
# launcher.
#
#   bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [GPUS] [test.py args...]
#
# GPUS (default 8, or $GPUS) is the number of tasks; environment:
# GPUS_PER_NODE (default: min(GPUS, 8)), CPUS_PER_TASK (5), SRUN_ARGS (further
# srun options), PYTHON (the repository's .venv/bin/python when it exists,
# else python).
set -u
DIR="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tools/slurm_args.sh
source "$DIR/slurm_args.sh"
slurm_parse_args CHECKPOINT test.py "$@" || exit 2

# SRUN_ARGS unquoted on purpose: several options in one variable
# shellcheck disable=SC2086
exec srun "${SRUN_OPTS[@]}" ${SRUN_ARGS:-} \
    "$PYTHON" -u "$DIR/test.py" "$CONFIG" "$ARG4" --launcher=slurm \
    "${TOOL_ARGS[@]}"
