"""The GPT-NeoX example trains on the bundled text: loss falls clearly."""
import importlib.util
from pathlib import Path

import pytest

from jaxsmp.trainer import parse_args, run

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_gpt_neox.py"


def test_trainer_loss_falls():
    cfg = parse_args(["--steps", "40", "--eval-every", "40", "--no-progress", "--tp", "2",
                      "--microbatches", "2", "--seq-len", "64"])
    history = run(cfg)
    assert history.losses[-1] < history.losses[0] - 1.5  # 5.5 -> below 4 nats/byte
    assert history.eval_losses[40] < history.losses[0] - 1.5


def test_example_script_runs(capsys):
    spec = importlib.util.spec_from_file_location("train_gpt_neox", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--steps", "3", "--eval-every", "0", "--no-progress", "--seq-len", "32"])
    assert "loss: first" in capsys.readouterr().out


def test_unknown_preset_flag():
    with pytest.raises(ValueError, match="unknown gpt_neox preset 'nope'"):
        run(parse_args(["--preset", "nope", "--steps", "1"]))
