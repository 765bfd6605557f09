"""TOML config files: sections of settings, unknown keys named with their file, and the
resolved config written back in a form --config reads."""
import pytest

from jaxsmp import StepOptions
from jaxsmp.cli import ConfigError, TrainConfig, parse_args
from jaxsmp.cli.config_file import config_toml, read_config_file, save_config


def _write(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_sections_hold_their_settings_and_none_means_none(tmp_path):
    path = _write(tmp_path, '[mesh]\nsdp = 4\ntp = 2\n[step]\nclip_norm = "none"\n'
                            '[logging]\nlog_dir = "runs/a"\nprogress = false\n')
    assert read_config_file(path) == {"sdp": 4, "tp": 2, "clip_norm": None,
                                      "log_dir": "runs/a", "progress": False}


@pytest.mark.parametrize("text, message", [
    ("[model]\npreset = 'tiny'\nlayers = 2\n", r"unknown key model.'layers' in .*run.toml; "
                                               r"valid keys of \[model\]: model, preset"),
    ("[model]\nsteps = 3\n", r"unknown key model.'steps' .*\(steps belongs in \[train\]\)"),
    ("[data]\nprefetch = 2\n", r"unknown key data.'prefetch' .*\(now read_ahead\)"),
    ("[optimizer]\nlr = 1.0\n", r"unknown section 'optimizer' in .*run.toml; valid sections"),
    ("[train]\nsteps = \n", r"run.toml is not valid TOML"),
    ("[train]\nsteps = [1, 2]\n", r"train.steps must be a single value"),
])
def test_bad_files_name_the_key_and_the_file(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        read_config_file(_write(tmp_path, text))


def test_a_bad_value_in_the_file_is_rejected_like_a_flag(tmp_path):
    with pytest.raises(ConfigError, match="steps must be >= 1, got 0"):
        parse_args(["--config", str(_write(tmp_path, "[train]\nsteps = 0\n"))])
    with pytest.raises(ConfigError, match="does not exist"):
        parse_args(["--config", str(tmp_path / "missing.toml")])


def test_the_resolved_config_reads_back_as_the_same_config(tmp_path):
    cfg = TrainConfig(model="llama", sdp=4, tp=2, lr=1e-5, data="a b/c.txt",
                      step=StepOptions(clip_norm=None, prefetch=None, bucket=False),
                      progress=False, profile_steps="2:4", log_dir="logs")
    path = save_config(cfg, tmp_path / "out")
    assert path.read_text() == config_toml(cfg)
    assert parse_args(["--config", str(path)]) == cfg
