"""A worker for the checkpoint-directory test: 2 processes look for checkpoints in a
directory that process 0 creates right after it looked and before process 1 looks (as
the trainer writes its config there while the other process is still starting). Both
must answer alike: opening orbax's store is a collective, and a process that opens it
alone waits for the other. Each prints what it found."""
import os
import sys

import jax
from orbax.checkpoint import multihost

from jaxsmp import distributed
from jaxsmp.checkpoint import CheckpointManager

distributed.initialize()
jax.devices()  # the processes join the backend together, before they wait
directory, me = sys.argv[1], os.environ["JAXSMP_PROCESS_ID"]
client = multihost.get_jax_distributed_client()
if me == "1":
    client.blocking_key_value_get("created", 60_000)
steps = CheckpointManager(directory).all_steps()
if me == "0":
    os.makedirs(directory)
    client.key_value_set("created", "1")
multihost.get_barrier_sync_fn()(key="looked", timeout_ms=60_000)
print(f"process {me} found steps {steps}", flush=True)
