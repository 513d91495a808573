# Sourced by tools/slurm_train.sh and tools/slurm_test.sh: the arguments and
# srun options they share (mmdet's launchers' interface).
#
#   slurm_parse_args NAME4 TOOL_ARGS "$@"
#
# parses PARTITION JOB_NAME CONFIG <NAME4> [GPUS] [tool args...] into
# PARTITION, JOB_NAME, CONFIG, ARG4, GPUS (default 8, or $GPUS) and the array
# TOOL_ARGS; fills the array SRUN_OPTS with the common srun options from the
# environment (GPUS_PER_NODE: min(GPUS, 8), CPUS_PER_TASK: 5, SRUN_ARGS);
# sets PYTHON (tools/python_env.sh: $PYTHON, else the repository's .venv
# python when it exists, else python) and exports PYTHONPATH with the repo root.
# Returns 2 after a usage line when fewer than 4 arguments are given.
slurm_parse_args() {
    local name4=$1 tool=$2
    shift 2
    if [ $# -lt 4 ]; then
        echo "usage: $0 PARTITION JOB_NAME CONFIG $name4 [GPUS] [$tool args...]" >&2
        return 2
    fi
    PARTITION=$1
    JOB_NAME=$2
    CONFIG=$3
    ARG4=$4
    shift 4
    if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then
        GPUS=$1
        shift
    else
        GPUS=${GPUS:-8}
    fi
    TOOL_ARGS=("$@")
    local per_node=${GPUS_PER_NODE:-$((GPUS < 8 ? GPUS : 8))}
    SRUN_OPTS=(-p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$per_node"
        --ntasks="$GPUS" --ntasks-per-node="$per_node"
        --cpus-per-task="${CPUS_PER_TASK:-5}" --kill-on-bad-exit=1)
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    # shellcheck source=tools/python_env.sh
    source "$root/tools/python_env.sh"
    export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
}
