"""Entry point of a SageMaker training job: one jaxsmp process per instance.

SageMaker starts this script on every instance with ``SM_HOSTS`` (the instances, as JSON)
and ``SM_CURRENT_HOST`` (this one) set; :mod:`jaxsmp.distributed` makes the first host of
the sorted list the coordinator (port ``MASTER_PORT``, default 12355) and this instance's
place in it the process id. Hyperparameters arrive as ``--name value`` arguments and go
to the trainer; the data channel ``train`` and the model directory are SageMaker's::

    estimator = PyTorch(entry_point="sagemaker_entry.py", source_dir="examples/cluster",
                        instance_count=4, instance_type="ml.p4de.24xlarge", ...,
                        hyperparameters={"config": "examples/configs/llama2_7b_4x8gpu.toml"})
"""
import json
import os
import sys

from jaxsmp.cli.entry import main


def trainer_args(env, argv: list[str]) -> list[str]:
    """The trainer's flags: SageMaker's data and checkpoint places, then the job's own
    (later flags win)."""
    hosts = json.loads(env["SM_HOSTS"])
    print(f"jaxsmp on {env['SM_CURRENT_HOST']} of {len(hosts)} instances {sorted(hosts)}",
          flush=True)
    args = []
    if "SM_CHANNEL_TRAIN" in env:
        args += ["--data", env["SM_CHANNEL_TRAIN"]]
    args += ["--checkpoint-dir", "/opt/ml/checkpoints"]  # synced to the job's checkpoint_s3_uri
    return args + argv


if __name__ == "__main__":
    main(trainer_args(os.environ, sys.argv[1:]))
