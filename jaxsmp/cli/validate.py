"""Checks of a training config, run before anything is built or compiled: each error
names the setting, the value and what would be valid."""
from __future__ import annotations

import dataclasses
import math

import collectives
from jaxsmp.checkpoint.manager import RESUME_MODES
from jaxsmp.context import STRATEGIES
from jaxsmp.models.registry import FAMILIES
from jaxsmp.nn.remat import POLICIES
from jaxsmp.pipeline.schedule import SCHEDULES
from jaxsmp.train.precision import PRECISIONS
from pallas_kernels.attention import IMPLS


class ConfigError(ValueError):
    """A training setting (flag, config-file key or value) is invalid."""


_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "None": type(None),
          "tuple[int, ...]": tuple}

CHOICES = {
    "model": tuple(sorted(FAMILIES)),
    "collectives": tuple(sorted(collectives.ALGORITHMS)) + ("auto",),
    "precision": tuple(sorted(PRECISIONS)),
    "remat": POLICIES,
    "attention": IMPLS,
    "pipeline": SCHEDULES,
    "resume": RESUME_MODES,
    "context_parallel": STRATEGIES,
}
# smallest valid value of each numeric setting
MINIMUM = {"steps": 1, "batch_size": 1, "seq_len": 2, "microbatches": 1, "virtual_chunks": 1,
           "dp": 1, "sdp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "simulate_devices": 1, "warmup": 0,
           "eval_every": 0, "eval_batches": 1, "read_ahead": 0, "save_every": 0, "keep": 1,
           "log_every": 1, "vocab_size": 1, "weight_decay": 0}
POSITIVE = ("lr", "clip_norm")  # real numbers > 0 (clip_norm may also be None)


def field_kinds(f: dataclasses.Field) -> tuple[type, ...]:
    """The Python types a field accepts, from its annotation (``"int | None"``)."""
    return tuple(_TYPES[t.strip()] for t in str(f.type).split("|"))


def _check_type(name: str, value, kinds: tuple[type, ...]) -> None:
    ok = any(isinstance(value, k) and not (k in (int, float) and isinstance(value, bool))
             for k in kinds) or (float in kinds and isinstance(value, int)
                                 and not isinstance(value, bool))
    if not ok:
        names = " or ".join("none" if k is type(None) else k.__name__ for k in kinds)
        raise ConfigError(f"{name} must be {names}, got {value!r}")


def _check_value(name: str, value) -> None:
    if value is None:
        return
    if name in CHOICES and value not in CHOICES[name]:
        raise ConfigError(f"unknown {name} {value!r}; valid: {', '.join(CHOICES[name])}")
    if name in MINIMUM and value < MINIMUM[name]:
        raise ConfigError(f"{name} must be >= {MINIMUM[name]}, got {value!r}")
    if name in POSITIVE and not (math.isfinite(value) and value > 0):
        hint = " (use none to disable clipping)" if name == "clip_norm" else ""
        raise ConfigError(f"{name} must be a positive number, got {value!r}{hint}")


def _check_profile_steps(cfg) -> None:
    text = cfg.profile_steps
    if text is None:
        return
    start, _, stop = text.partition(":")
    if not (start.isdigit() and stop.isdigit() and 1 <= int(start) < int(stop)):
        raise ConfigError(f"profile_steps must be START:STOP with 1 <= START < STOP "
                          f"(e.g. 5:8), got {text!r}")
    if cfg.log_dir is None:
        raise ConfigError("profile_steps needs log_dir: the trace is written to LOG_DIR/profile")


def _check_context(cfg) -> None:
    strategy = cfg.step.context_parallel
    if strategy != "auto" and cfg.cp == 1:
        raise ConfigError(f"context_parallel {strategy!r} splits sequences over "
                          f"cp, but cp is 1; set cp > 1 or drop context_parallel")
    if cfg.cp > 1 and cfg.seq_len % (2 * cfg.cp):
        raise ConfigError(f"seq_len {cfg.seq_len} must be a multiple of 2*cp = {2 * cfg.cp} "
                          f"(context parallelism cuts each sequence into 2*cp chunks)")
    if cfg.cp > 1 and cfg.pp > 1:
        raise ConfigError(f"cp={cfg.cp} with pp={cfg.pp}: context and pipeline parallelism "
                          f"together are not supported yet; set one of them to 1")


def check_config(cfg, values: dict, settings: dict) -> None:
    """Raises :class:`ConfigError` for the first invalid value of ``values`` (settings
    by name, each with its ``kinds``), then, given the whole ``cfg``, for settings that
    do not go together."""
    for name, value in values.items():
        _check_type(name, value, settings[name].kinds)
        _check_value(name, value)
    if cfg is None:
        return
    _check_profile_steps(cfg)
    if cfg.step.sequence_parallel and cfg.tp == 1:
        raise ConfigError("sequence_parallel splits activations over tp, but tp is 1; "
                          "set tp > 1 or drop sequence_parallel")
    _check_context(cfg)
    if cfg.init_from_hf is None and cfg.preset not in FAMILIES[cfg.model]:
        raise ConfigError(f"unknown {cfg.model} preset {cfg.preset!r}; valid: "
                          f"{', '.join(FAMILIES[cfg.model])}")
