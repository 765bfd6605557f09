"""The training loop the example scripts share: flags, progress bar, evaluation."""
from jaxsmp.trainer.config import TrainConfig, parse_args
from jaxsmp.trainer.loop import run

__all__ = ["TrainConfig", "parse_args", "run"]
