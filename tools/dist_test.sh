#!/usr/bin/env bash
# Distributed testing with torchrun and MMEngine's DDP (gloo on CPU, nccl on CUDA).
#   bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py args...]
set -e
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
DIR="$(cd "$(dirname "$0")" && pwd)"
PYTHON=${PYTHON:-python}

PYTHONPATH="$DIR/..":$PYTHONPATH \
"$PYTHON" -m torch.distributed.run \
    --nnodes=$NNODES \
    --node_rank=$NODE_RANK \
    --master_addr=$MASTER_ADDR \
    --nproc_per_node=$NPROC \
    --master_port=$PORT \
    "$DIR/test.py" \
    $CONFIG $CHECKPOINT \
    --launcher pytorch ${@:4}
