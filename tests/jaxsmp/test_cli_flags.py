"""Training settings: flags over a TOML file over the script's defaults, and every bad
value rejected at parse time with its name, before any device work."""
import dataclasses

import pytest

from jaxsmp import StepOptions
from jaxsmp.cli import ConfigError, TrainConfig, parse_args
from jaxsmp.cli.config import NOT_FLAGS, SETTINGS
from jaxsmp.cli.entry import main


def test_flags_override_the_config_file_which_overrides_the_scripts_defaults(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nmodel = "llama"\n[train]\nsteps = 5\nlr = 1e-3\n')
    cfg = parse_args(["--config", str(path), "--steps", "7"], model="bloom")
    assert (cfg.model, cfg.steps, cfg.lr) == ("llama", 7, 1e-3)
    assert parse_args([], model="bloom").model == "bloom"


def test_clipping_can_be_switched_off_on_the_command_line():
    assert parse_args(["--clip-norm", "none"]).step.clip_norm is None
    assert parse_args(["--clip-norm", "0.5"]).step.clip_norm == 0.5


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "steps must be >= 1, got 0"),
    (["--steps", "-1"], "steps must be >= 1, got -1"),
    (["--clip-norm", "0"], "clip_norm must be a positive number, got 0.0 .*none"),
    (["--clip-norm", "-1"], "clip_norm must be a positive number, got -1.0"),
    (["--collectives", "fast"], "unknown collectives 'fast'; valid: a2a, ffi, .*auto"),
    (["--precision", "fp4"], "unknown precision 'fp4'; valid: bf16, fp16, "),
    (["--remat", "some"], "unknown remat 'some'; valid: none, full"),
    (["--attention", "flash"], "unknown attention 'flash'; valid: auto"),
    (["--pipeline", "zb"], "unknown pipeline 'zb'; valid: simple"),
    (["--resume", "maybe"], "unknown resume 'maybe'; valid: auto, require, never"),
    (["--model", "gpt2"], "unknown model 'gpt2'; valid: bloom, gpt_neox, llama"),
    (["--batch-size", "0"], "batch_size must be >= 1"),
    (["--profile-steps", "8:5", "--log-dir", "x"], "profile_steps must be START:STOP"),
    (["--profile-steps", "5:8"], "profile_steps needs log_dir"),
    (["--cp", "0"], "cp must be >= 1, got 0"),
    (["--context-parallel", "zigzag"], "unknown context_parallel 'zigzag'; valid: auto, ulysses"),
    (["--context-parallel", "ring"], "context_parallel 'ring' splits sequences over cp, but cp"),
    (["--cp", "4", "--seq-len", "100"], "seq_len 100 must be a multiple of 2.cp = 8"),
    (["--cp", "2", "--pp", "2"], "context and pipeline parallelism together are not supported"),
])
def test_bad_settings_are_rejected_naming_the_value(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(argv)


def test_the_same_checks_apply_to_a_config_built_in_python():
    with pytest.raises(ConfigError, match="steps must be >= 1"):
        TrainConfig(steps=0)
    with pytest.raises(ConfigError, match="seq_len must be int, got '64'"):
        TrainConfig(seq_len="64")


def test_the_entry_point_exits_with_the_error_before_starting_jax(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--steps", "-1"], model="gpt_neox")
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: steps must be >= 1, got -1\n"


def test_a_flag_of_the_wrong_type_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--steps", "many"])
    assert "--steps takes int, got 'many'" in capsys.readouterr().err


def test_the_step_section_is_the_steps_own_options():
    cfg = parse_args(["--remat", "full", "--microbatches", "2", "--no-bucket", "--prefetch"])
    assert cfg.step == StepOptions(remat="full", microbatches=2, bucket=False, prefetch=True)
    assert parse_args(["--prefetch", "off"]).step.prefetch is False
    assert parse_args(["--prefetch", "auto"]).step.prefetch is None
    assert parse_args([]).step == StepOptions()


def test_every_step_option_is_a_flag_unless_the_mesh_sets_it():
    exposed = {n for n, s in SETTINGS.items() if s.section == "step"}
    options = {f.name for f in dataclasses.fields(StepOptions)}
    assert options - exposed == set(NOT_FLAGS), \
        "a new StepOptions field needs a flag: add it to STEP_HELP in jaxsmp/cli/config.py"


def test_batches_read_ahead_is_its_own_setting_not_the_layer_prefetch():
    cfg = parse_args(["--read-ahead", "0"])
    assert cfg.read_ahead == 0 and cfg.step.prefetch is None
    with pytest.raises(ConfigError, match="read_ahead must be >= 0, got -1"):
        parse_args(["--read-ahead", "-1"])


def test_a_bad_step_option_is_rejected_in_the_trainers_words(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--prefetch", "maybe"])
    assert "--prefetch takes bool or auto, got 'maybe'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="microbatches must be >= 1, got 0"):
        parse_args(["--microbatches", "0"])


def test_a_pipeline_partition_is_a_word_or_layer_counts(tmp_path):
    if "pipeline_partition" not in SETTINGS:
        pytest.skip("StepOptions has no pipeline_partition in this tree")
    assert parse_args(["--pipeline-partition", "equal"]).step.pipeline_partition == "equal"
    assert parse_args(["--pipeline-partition", "1,3"]).step.pipeline_partition == (1, 3)
    path = tmp_path / "run.toml"
    path.write_text("[step]\npipeline_partition = [1, 3]\n")
    cfg = parse_args(["--config", str(path)])
    assert cfg.step.pipeline_partition == (1, 3)
    with pytest.raises(ConfigError, match="pipeline_partition must be 'auto', 'equal' or"):
        parse_args(["--pipeline-partition", "0,4"])
