#!/bin/bash
# torchrun on each of 4 nodes, one jaxsmp process per node (torchrun's RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT; JAX's coordinator takes MASTER_PORT + 1):
#   NODE_RANK=<0..3> MASTER_ADDR=<node 0> examples/cluster/torchrun.sh --data data/corpus
# On one machine, 2 processes of 4 simulated CPU devices each:
#   JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4 \
#       torchrun --nproc_per_node 2 -m jaxsmp.train --dp 2 --sdp 4
set -euo pipefail
torchrun --nnodes 4 --nproc_per_node 1 --node_rank "${NODE_RANK:?}" \
    --master_addr "${MASTER_ADDR:?}" --master_port "${MASTER_PORT:-29500}" \
    -m jaxsmp.train --config "${CONFIG:-examples/configs/llama2_7b_4x8gpu.toml}" "$@"
