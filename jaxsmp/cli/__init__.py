"""The training loop the examples share: flags and config files, data, metrics,
checkpoints, profiling and preemption."""
from jaxsmp.cli.config import ConfigError, TrainConfig
from jaxsmp.cli.flags import parse_args
from jaxsmp.cli.loop import History, run
from jaxsmp.cli.preemption import PREEMPTED_EXIT_CODE, Preempted

__all__ = ["ConfigError", "History", "PREEMPTED_EXIT_CODE", "Preempted", "TrainConfig",
           "parse_args", "run"]
