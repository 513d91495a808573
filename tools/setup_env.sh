#!/usr/bin/env bash
# Create .venv/ in the repo root and install the mmpe stack into it.
#
# Idempotent: a stamp file records the hash of the requirement files and of this
# script, so a second run with nothing changed returns in about a second.
#
#   bash tools/setup_env.sh          # runtime stack
#   bash tools/setup_env.sh tests    # runtime stack + test dependencies
#
# Offline (a node without a package index): MMPE_WHEELHOUSE=DIR installs
# only from DIR, made on a connected machine by tools/make_wheelhouse.sh.
# mmcv's ops are compiled for CUDA where torch sees a GPU and a CUDA
# compiler is present, else for CPU; MMPE_MMCV_OPS=cpu asks for the CPU ops
# only (the GPU hidden from the build: a quick check, about 2 minutes with
# 16 jobs; the heads that call mmcv's CUDA ops then fail on CUDA).
# MMPE_SYSTEM_SITE=1 makes the venv see the Python's own packages (a node
# image whose Python has PyTorch and Triton: they are kept, as a torch
# installed into .venv first is).
#
# The slow part of a first run is mmcv 2.1.0's C++ ops (about 12 minutes on two
# cores); pip caches the built wheel, so later fresh venvs install it in seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMPE_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
EXTRA="${1:-}"

hash_inputs() {
    cat "$ROOT"/requirements/*.txt "$ROOT/tools/setup_env.sh" "$ROOT/setup.py" \
        "$ROOT"/mmpe/csrc/*.cpp "$ROOT"/mmpe/csrc/*.h | sha256sum | cut -c1-16
}
STAMP="$VENV/.mmpe-setup-${EXTRA:-runtime}-$(hash_inputs)"
if [ -f "$STAMP" ]; then
    echo "[setup] $VENV is up to date"
    exit 0
fi

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv ${MMPE_SYSTEM_SITE:+--system-site-packages} "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
OFFLINE=()
if [ -n "${MMPE_WHEELHOUSE:-}" ]; then
    [ -d "$MMPE_WHEELHOUSE" ] || { echo "[setup] MMPE_WHEELHOUSE=$MMPE_WHEELHOUSE is not a folder" >&2; exit 2; }
    echo "[setup] offline: installing from $MMPE_WHEELHOUSE only"
    OFFLINE=(--no-index --find-links "$(cd "$MMPE_WHEELHOUSE" && pwd)")
fi
"${PIP[@]}" install "${OFFLINE[@]}" -q --upgrade pip "setuptools<70" wheel

# Keep a torch the user installed first (e.g. a CUDA build); otherwise the CPU build.
if "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] keeping torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
else
    echo "[setup] installing torch==${MMPE_TORCH_VERSION:-2.13.0}"
    "${PIP[@]}" install "${OFFLINE[@]}" -q "torch==${MMPE_TORCH_VERSION:-2.13.0}"
fi

# setuptools < 70 again: torch's install may upgrade it, and mmcv 2.1.0's
# setup.py needs pkg_resources.
# Every later install is constrained to this torch, so that no dependency
# swaps it (e.g. for a multi-GB CUDA build) under the compiled mmcv ops.
TORCH_VERSION="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
CONSTRAINTS="$VENV/mmpe-constraints.txt"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
# The same guard for any later `pip install` into this venv (mmcv's ops are
# compiled against this torch). Remove .venv/pip.conf to change torch.
printf '[install]\nconstraint = %s\n' "$CONSTRAINTS" > "$VENV/pip.conf"
PIP=("${PIP[@]}" install "${OFFLINE[@]}" -c "$CONSTRAINTS")
"${PIP[@]}" -q "numpy<2" "mmengine==0.10.7" "setuptools<70" ninja psutil

# mmcv with its compiled ops (mmdet 3.3.0 refuses mmcv >= 2.2.0, and PyPI has no
# wheel of 2.1.0 for current torch). --no-build-isolation so it builds against
# the torch in this venv.
if ! "$VENV/bin/python" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '2.1.0'" >/dev/null 2>&1; then
    echo "[setup] installing mmcv==2.1.0 with ops (built from source the first time: ~12 min on 2 cores; pip caches the wheel)"
    MMCV_ENV=()
    case "${MMPE_MMCV_OPS:-auto}" in
        auto) ;;
        cpu) echo "[setup] mmcv: CPU ops only (MMPE_MMCV_OPS=cpu)"
             MMCV_ENV=(CUDA_VISIBLE_DEVICES= FORCE_CUDA=0) ;;
        *) echo "[setup] MMPE_MMCV_OPS=${MMPE_MMCV_OPS} is not a choice; choose auto or cpu" >&2
           exit 2 ;;
    esac
    env "${MMCV_ENV[@]}" MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        "${PIP[@]}" --no-build-isolation "mmcv==2.1.0"
fi

"${PIP[@]}" -q -r "$ROOT/requirements/runtime.txt"
# Triton (the fused attention kernel on CUDA): a CUDA torch brings its own
# release, which stays; otherwise the pinned one (its interpreter runs the
# kernel's tests on CPU).
if ! "$VENV/bin/python" -c "import triton" >/dev/null 2>&1; then
    "${PIP[@]}" -q -r "$ROOT/requirements/triton.txt"
fi
if [ "$EXTRA" = "tests" ]; then
    "${PIP[@]}" -q -r "$ROOT/requirements/tests.txt"
    # the ONNX packages may pull numpy 2; the stack (mmcv 2.1.0's ops, mmdet
    # 3.3.0) needs numpy<2, with which they work.
    "${PIP[@]}" -q "numpy<2"
    # --no-deps: timm declares torchvision, which does not load beside the CPU
    # torch (see requirements/tests-nodeps.txt); tests give it a stand-in.
    "${PIP[@]}" -q --no-deps -r "$ROOT/requirements/tests-nodeps.txt"
fi
# The plugin itself, editable, without touching the pinned stack.
"${PIP[@]}" -q --no-deps --no-build-isolation -e "$ROOT"

"$VENV/bin/python" - <<'PY'
import mmcv, mmdet, mmengine, mmseg, torch
import mmdet.models  # noqa: F401  (needs mmcv.ops)
import mmseg.models  # noqa: F401  (needs ftfy, regex)
from mmcv.ops import nms
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]])
nms(boxes, torch.tensor([0.9, 0.8]), 0.5)
print(f'[setup] torch {torch.__version__}, mmengine {mmengine.__version__}, '
      f'mmcv {mmcv.__version__} (ops ok), mmdet {mmdet.__version__}, '
      f'mmseg {mmseg.__version__}')
from mmpe.models.layers.attention.fused import fused_unavailable_reason
reason = fused_unavailable_reason()
print('[setup] mmpe fused CPU attention kernel: '
      + ('built' if reason is None else f'NOT available: {reason}; the '
         'attention falls back to the PyTorch backends'))
PY
if [ "$EXTRA" = "tests" ]; then
    (cd "$ROOT/tests" && "$VENV/bin/python" -c "
from timm_stub import import_timm
timm = import_timm()
timm.create_model('deit_tiny_patch16_224', pretrained=False)
print(f'[setup] timm {timm.__version__} (tests, torchvision stand-in)')")
fi
rm -f "$VENV"/.mmpe-setup-"${EXTRA:-runtime}"-*
touch "$STAMP"
echo "[setup] done in $(( $(date +%s) - start )) s"
