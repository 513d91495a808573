# Sourced by the launchers (tools/dist_train.sh, tools/dist_test.sh and, through
# tools/slurm_args.sh, tools/slurm_train.sh / tools/slurm_test.sh): sets PYTHON,
# the interpreter they start, unless the caller set it:
#   1. $PYTHON, when set;
#   2. the environment `make demo` / `make test` create (tools/setup_env.sh):
#      $MMPE_VENV/bin/python, by default the repository's .venv/bin/python;
#   3. otherwise `python` from PATH.
# So `bash tools/dist_train.sh CONFIG 2` works after `make demo` without
# activating the environment first.
_mmpe_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_mmpe_venv="${MMPE_VENV:-$_mmpe_root/.venv}"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$_mmpe_venv/bin/python" ]; then
        PYTHON="$_mmpe_venv/bin/python"
    else
        PYTHON=python
    fi
fi
unset _mmpe_root _mmpe_venv
