"""The training loop on a prepared dataset: exact resume, metrics (JSON lines and
TensorBoard), the resolved config, the loss plot and a profile."""
import dataclasses
import json
import struct

import pytest

from jaxsmp.checkpoint import CheckpointNotFoundError
from jaxsmp.cli import TrainConfig, parse_args, run
from jaxsmp.cli.batches import run_data
from jaxsmp.cli.build import model_vocab
from jaxsmp.cli.config_file import read_config_file

TRAIN_KEYS = {"loss", "learning_rate", "grad_norm", "tokens_per_second", "tflops_per_device",
              "mfu", "step_seconds", "data_seconds"}


@pytest.fixture(scope="module")
def cfg(prepared_dir, bpe_tokenizer_file):
    return TrainConfig(data=str(prepared_dir), tokenizer=str(bpe_tokenizer_file), steps=6,
                       batch_size=8, seq_len=32, eval_every=3, eval_batches=1, progress=False)


def tensorboard_values(log_dir):
    """(step, summary value) of every summary in the TensorBoard event files in
    ``log_dir`` (TFRecord framing)."""
    from tensorboardX.proto.event_pb2 import Event
    for path in log_dir.glob("events.out.tfevents.*"):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = Event.FromString(data[at + 12:at + 12 + length])
            at += 16 + length
            yield from ((event.step, value) for value in event.summary.value)


def tensorboard_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Scalars of the TensorBoard event files in ``log_dir``."""
    scalars = {}
    for step, value in tensorboard_values(log_dir):
        if not value.HasField("histo"):
            scalars.setdefault(value.tag, []).append((step, value.simple_value))
    return scalars


def test_a_resumed_run_repeats_the_uninterrupted_runs_batches_and_losses(cfg, tmp_path):
    logs = tmp_path / "logs"
    whole = run(dataclasses.replace(cfg, log_dir=str(logs), profile_steps="2:4"))
    ckpt = dict(checkpoint_dir=str(tmp_path / "ckpt"), save_every=3)
    first = run(dataclasses.replace(cfg, steps=3, **ckpt))
    second = run(dataclasses.replace(cfg, **ckpt))
    assert second.start_step == 3
    assert first.losses + second.losses == whole.losses  # bitwise
    assert second.eval_losses == {k: v for k, v in whole.eval_losses.items() if k > 3}
    assert whole.losses[-1] < whole.losses[0]

    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert TRAIN_KEYS <= set(train[0]) and [r["loss"] for r in train] == whole.losses
    assert [(r["step"], r["loss"]) for r in records if r["split"] == "eval"] == \
        list(whole.eval_losses.items())
    scalars = tensorboard_scalars(logs)
    assert [s for s, _ in scalars["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert scalars["eval/loss"][-1] == (6, pytest.approx(whole.eval_losses[6]))
    assert TRAIN_KEYS <= {t.split("/")[1] for t in scalars}
    assert whole.plot == str(logs / "curves.png") and (logs / "curves.png").stat().st_size > 10_000
    assert list((logs / "profile").rglob("*.xplane.pb"))  # steps 2 and 3 traced
    assert list((logs / "profile").rglob("perfetto_trace.json.gz"))
    for directory in (logs, tmp_path / "ckpt"):
        assert read_config_file(directory / "config.toml")["data"] == cfg.data


def test_a_dataset_tokenized_otherwise_is_refused(cfg):
    with pytest.raises(ValueError, match="was tokenized with .* not with bytes"):
        run_data(dataclasses.replace(cfg, tokenizer="bytes"))


def test_the_model_vocabulary_grows_to_hold_the_tokenizers(cfg):
    assert run_data(cfg).vocab_size == 512
    assert model_vocab(cfg, preset_vocab=256, data_vocab=512) == 512
    assert model_vocab(cfg, preset_vocab=256, data_vocab=300) == 384
    assert model_vocab(cfg, preset_vocab=50_432, data_vocab=512) == 50_432
    with pytest.raises(ValueError, match="vocab_size=300 is smaller than the tokenizer's 512"):
        model_vocab(dataclasses.replace(cfg, vocab_size=300), 256, 512)


def test_requiring_a_missing_checkpoint_fails_first_and_creates_nothing(cfg, tmp_path):
    missing = tmp_path / "none" / "ckpt"
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        run(dataclasses.replace(cfg, checkpoint_dir=str(missing), resume="require"))
    assert not (tmp_path / "none").exists()


@pytest.mark.slow  # three fp8 runs compiled on 8 devices: 40 s
def test_an_fp8_run_resumes_with_its_amax_histories(cfg, tmp_path):
    """The trainer builds its state without histories (the step adds them at its first
    call); resuming must restore the checkpoint's histories, not refuse them."""
    argv = ["--data", cfg.data, "--tokenizer", cfg.tokenizer, "--batch-size", "8",
            "--seq-len", "32", "--eval-every", "0", "--no-progress", "--precision", "fp8",
            "--fp8-history", "4", "--checkpoint-dir", str(tmp_path / "ckpt")]
    whole = run(parse_args([*argv[:-2], "--steps", "3"]))
    first = run(parse_args([*argv, "--steps", "2"]))
    second = run(parse_args([*argv, "--steps", "3", "--resume", "require"]))
    assert second.start_step == 2
    assert first.losses + second.losses == whole.losses  # bitwise


def test_evaluation_runs_with_every_step_option_of_the_run(cfg):
    """The eval step gets the train step's options: an fp8 run with a history other than
    the default evaluates (the eval step had refused the state's histories), and the
    step options of both are one."""
    from jaxsmp.cli.loop import _compiled_steps
    from jaxsmp.train.options import StepOptions
    step = StepOptions(precision="fp8", fp8_history=8, remat="full")
    fp8 = dataclasses.replace(cfg, steps=2, eval_every=2, step=step)
    train_step, evaluate = _compiled_steps(fp8)
    assert evaluate.options == train_step.options == step
    result = run(fp8)
    assert list(result.eval_losses) == [2]


def test_a_mixtral_run_logs_its_router_losses_and_each_layers_expert_load(cfg, tmp_path):
    moe = dataclasses.replace(cfg, model="mixtral", preset="tiny", steps=2, eval_every=2,
                              log_dir=str(tmp_path))
    run(moe)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert {"lm_loss", "aux_loss", "z_loss", "dropped_tokens"} <= set(train[-1])
    assert train[-1]["aux_loss"] > 0 and train[-1]["dropped_tokens"] == 0
    histograms = {value.tag: list(value.histo.bucket)
                  for _, value in tensorboard_values(tmp_path) if value.HasField("histo")}
    assert sorted(histograms) == [f"train/expert_load/layer_{i}" for i in range(4)]
    assert all(len(b) == 4 and abs(sum(b) - 1) < 1e-5 for b in histograms.values())


def test_the_trainer_runs_remat_save_qkv_with_the_losses_of_no_remat(cfg):
    """``--remat save_qkv`` (MaxText's save_qkv_proj) through the trainer: the step
    recomputes the layers but their q, k, v projections and trains as ``none`` does."""
    argv = ["--data", cfg.data, "--tokenizer", cfg.tokenizer, "--batch-size", "8",
            "--seq-len", "32", "--eval-every", "0", "--no-progress", "--steps", "3"]
    plain = run(parse_args([*argv, "--remat", "none"]))
    kept = run(parse_args([*argv, "--remat", "save_qkv"]))
    assert kept.losses == pytest.approx(plain.losses, rel=1e-5)
    assert kept.losses[-1] < kept.losses[0]
