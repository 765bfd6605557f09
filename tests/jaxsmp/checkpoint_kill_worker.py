"""Runs ``jaxsmp.cli.run`` and SIGKILLs its own process in the middle of saving
checkpoint step ``kill_step``: after the arrays and metadata are written into the
temporary step directory, just before orbax commits it by renaming it into place.

    python checkpoint_kill_worker.py '<TrainConfig settings as JSON (jaxsmp.cli.config.flat)>' <kill_step>
"""
import json
import os
import signal
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from orbax.checkpoint._src.path import atomicity

from jaxsmp.cli import run
from jaxsmp.cli.config import make_config


def kill_during_commit(step: str) -> None:
    original = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self):
        if self.get_final().name == step:
            print(f"KILLING during commit of {self.get()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return await original(self)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize


if __name__ == "__main__":
    kill_during_commit(sys.argv[2])
    run(make_config(json.loads(sys.argv[1])))
    print("FINISHED without being killed", flush=True)
