"""A worker for the first-run meeting test: 2 processes of 2 CPU devices (sdp=4) train a
tiny model for 2 steps; process 1 starts its first step ``LATE_S`` seconds after process
0, longer than gloo's fixed 30 s rendezvous, as a process still compiling on a loaded
host would. Process 0 prints the losses."""
import os
import time

import numpy as np
import optax

import jaxsmp
from jaxsmp import distributed
from jaxsmp.losses import causal_lm_loss

LATE_S = 40

distributed.initialize()
mesh = jaxsmp.Mesh(sdp=4)
config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=1)
state = jaxsmp.init(config.build, optax.adamw(1e-3), mesh)
step = jaxsmp.step(causal_lm_loss)
batch = {"tokens": np.random.default_rng(0).integers(0, config.vocab_size, (8, 16),
                                                     dtype=np.int32)}
if os.environ["JAXSMP_PROCESS_ID"] == "1":
    time.sleep(LATE_S)
losses = []
for _ in range(2):
    state, metrics = step(state, batch)
    losses.append(float(np.asarray(metrics["loss"].addressable_data(0))))
if os.environ["JAXSMP_PROCESS_ID"] == "0":
    print("losses:", losses, flush=True)
