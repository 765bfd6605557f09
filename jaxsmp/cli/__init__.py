"""The training loop the example scripts share: flags, progress bar, evaluation."""
from jaxsmp.cli.config import TrainConfig, parse_args
from jaxsmp.cli.loop import run

__all__ = ["TrainConfig", "parse_args", "run"]
