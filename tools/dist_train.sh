#!/usr/bin/env bash
# Distributed training with torchrun and MMEngine's DDP (gloo on CPU, nccl on CUDA).
#   bash tools/dist_train.sh CONFIG NUM_PROCS [train.py args...]
# PYTHON (default: the repository's .venv/bin/python when it exists, as
# `make demo` / `make test` create it, else python), NNODES, NODE_RANK,
# PORT, MASTER_ADDR.
set -e
CONFIG=$1
NPROC=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
DIR="$(cd "$(dirname "$0")" && pwd)"
# PYTHON: the repository's .venv python unless set (tools/python_env.sh)
source "$DIR/python_env.sh"

PYTHONPATH="$DIR/..":$PYTHONPATH \
"$PYTHON" -m torch.distributed.run \
    --nnodes=$NNODES \
    --node_rank=$NODE_RANK \
    --master_addr=$MASTER_ADDR \
    --nproc_per_node=$NPROC \
    --master_port=$PORT \
    "$DIR/train.py" \
    $CONFIG \
    --launcher pytorch ${@:3}
