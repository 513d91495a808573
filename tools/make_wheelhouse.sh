#!/usr/bin/env bash
# Make a wheelhouse for a machine without a package index (a GPU node of a
# cluster): run this on a connected machine, copy the folder over, and on
# the node run `MMPE_WHEELHOUSE=<folder> bash tools/setup_env.sh tests`
# (docs/get_started.md, "A GPU node without internet").
#
#   bash tools/make_wheelhouse.sh DIR                 # this machine's Python and platform
#   bash tools/make_wheelhouse.sh DIR --python 3.11 --platform manylinux_2_28_x86_64 \
#        --torch-index https://download.pytorch.org/whl/cu128   # another node's
#   bash tools/make_wheelhouse.sh DIR --python 3.12 --platform manylinux_2_28_x86_64 \
#        --no-torch     # a node whose Python already has PyTorch and Triton
#                       # (there: MMPE_SYSTEM_SITE=1, see tools/setup_env.sh)
#
# It holds: the stack's wheels (torch from --torch-index, or the index pip is
# given; the runtime, test, Triton and build requirements), mmcv 2.1.0's
# source (compiled on the node, against its torch), and nothing of mmpe
# (the node has the repository). With --platform, pip takes binary wheels
# only (every package of the stack has one for manylinux x86_64 / Python
# 3.11, except mmcv, whose source is platform-free); --platform may be given
# several times (pip matches each manylinux tag exactly).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
usage() {
    echo "usage: $0 DIR [--python X.Y] [--platform TAG] [--torch-index URL]" >&2
    exit 2
}
[ $# -ge 1 ] || usage
DEST="$1"; shift
PYVER="" TORCH_INDEX="" NO_TORCH=""
PLATFORMS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --python) PYVER="${2:?--python needs a version such as 3.11}"; shift 2 ;;
        --platform) PLATFORMS+=(--platform "${2:?--platform needs a tag such as manylinux_2_28_x86_64}"); shift 2 ;;
        --torch-index) TORCH_INDEX="${2:?--torch-index needs a URL}"; shift 2 ;;
        --no-torch) NO_TORCH=1; shift ;;
        *) echo "unknown option '$1'; choose from --python, --platform, --torch-index, --no-torch" >&2; usage ;;
    esac
done
mkdir -p "$DEST"
TARGET=()
[ -n "$PYVER" ] && TARGET+=(--python-version "$PYVER")
TARGET+=("${PLATFORMS[@]}")
[ ${#TARGET[@]} -gt 0 ] && TARGET+=(--only-binary=:all:)
DL=("$PYTHON" -m pip download -q -d "$DEST" "${TARGET[@]}")

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
TRITON=(-r "$ROOT/requirements/triton.txt")
if [ -n "$NO_TORCH" ]; then
    # the node's torch (and the Triton it came with) stay; nothing here may
    # ask for another torch
    echo "[wheelhouse] no torch, no Triton (--no-torch: the node's stay)"
    TRITON=()
    : > "$CONSTRAINTS"
else
    TORCH_VERSION="${MMPE_TORCH_VERSION:-2.13.0}"
    echo "[wheelhouse] torch==$TORCH_VERSION${TORCH_INDEX:+ from $TORCH_INDEX}"
    "${DL[@]}" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "torch==$TORCH_VERSION"
    # everything else resolved against that torch (no second torch); a CUDA
    # torch pins its own Triton, which setup_env.sh then keeps
    echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
    [ -n "$TORCH_INDEX" ] && TRITON=()
fi
echo "[wheelhouse] build tools, the runtime and test requirements${TRITON:+, Triton}"
DEPS=(pip "setuptools<70" wheel ninja psutil "numpy<2" "mmengine==0.10.7"
      -r "$ROOT/requirements/runtime.txt" -r "$ROOT/requirements/tests.txt"
      "${TRITON[@]}")
"${DL[@]}" -c "$CONSTRAINTS" ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} "${DEPS[@]}"
if [ -n "$NO_TORCH" ] && ls "$DEST"/torch-* >/dev/null 2>&1; then
    echo "[wheelhouse] --no-torch, but a requirement pulled torch into $DEST" >&2
    exit 1
fi
# tests-nodeps: installed with --no-deps by setup_env.sh, so downloaded so
"${DL[@]}" --no-deps -r "$ROOT/requirements/tests-nodeps.txt"
# mmcv's build needs (mmcv 2.1.0's setup.py: addict, packaging, pillow,
# pyyaml, yapf, opencv; mmengine's: termcolor, rich...) come with mmengine
echo "[wheelhouse] mmcv 2.1.0 source (compiled on the node)"
# pip reads the source's metadata in an isolated build environment, where
# mmcv 2.1.0's setup.py needs pkg_resources (setuptools < 70): the
# constraint reaches that environment through PIP_CONSTRAINT
echo "setuptools<70" >> "$CONSTRAINTS"
PIP_CONSTRAINT="$CONSTRAINTS" "$PYTHON" -m pip download -q -d "$DEST" \
    --no-deps --no-binary :all: "mmcv==2.1.0"
count=$(find "$DEST" -maxdepth 1 -type f | wc -l)
echo "[wheelhouse] $DEST: $count files, $(du -sh "$DEST" | cut -f1)"
echo "[wheelhouse] on the node: MMPE_WHEELHOUSE=$DEST bash tools/setup_env.sh tests"
