"""``--config run.toml``: TrainConfig fields grouped in sections, and the resolved
config written back in the same form (so it can be passed to ``--config`` again).

    [model]
    model = "gpt_neox"
    preset = "tiny"
    [mesh]
    sdp = 4
    tp = 2
    [step]                 # the step's options (jaxsmp.train.options.StepOptions)
    remat = "full"
    clip_norm = "none"     # optional settings take the string "none"
    [train]
    batch_size = 32

Keys are the flag names with underscores. An unknown section or key is an error
naming it and the file.
"""
from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from jaxsmp.cli.config import SECTIONS, SETTINGS, TrainConfig, flat, section_of
from jaxsmp.cli.validate import ConfigError

RENAMED = {"prefetch": ("data", "read_ahead")}  # old key -> its section, its new name


def _value(name: str, value, path: str):
    """A TOML value for setting ``name``: ``"none"`` is None where the setting allows it."""
    s = SETTINGS[name]
    if type(None) in s.kinds and isinstance(value, str) and value.lower() == s.none_word:
        return None
    if isinstance(value, list) and tuple in s.kinds:
        return tuple(value)
    if isinstance(value, (dict, list)):
        raise ConfigError(f"{path}: {section_of(name)}.{name} must be a single value, "
                          f"got {value!r}")
    return value


def _section_keys(section: str) -> list[str]:
    return [n for n in SETTINGS if section_of(n) == section]


def _unknown_key(section: str, key: str, path: str) -> ConfigError:
    if RENAMED.get(key, (None,))[0] == section:
        hint = f" (now {RENAMED[key][1]})"
    elif key in SETTINGS:
        hint = f" ({key} belongs in [{section_of(key)}])"
    else:
        hint = f"; valid keys of [{section}]: {', '.join(_section_keys(section))}"
    return ConfigError(f"unknown key {section}.{key!r} in {path}{hint}")


def read_config_file(path: str | os.PathLike) -> dict:
    """The settings of a TOML config file as ``{field: value}``; raises
    :class:`ConfigError` for a missing file, bad TOML, or an unknown section or key."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path!r} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from None
    values = {}
    for section, keys in doc.items():
        if section not in SECTIONS or not isinstance(keys, dict):
            raise ConfigError(f"unknown section {section!r} in {path}; valid sections: "
                              f"{', '.join(SECTIONS)}")
        for key, value in keys.items():
            if key not in SETTINGS or section_of(key) != section:
                raise _unknown_key(section, key, path)
            values[key] = _value(key, value, path)
    return values


def _toml_value(value, none_word: str = "none") -> str:
    if value is None:
        return f'"{none_word}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return repr(value)


def config_toml(cfg: TrainConfig) -> str:
    """``cfg`` as a TOML config file (every setting, by section)."""
    lines, values = [], flat(cfg)
    for section in SECTIONS:
        lines.append(f"[{section}]")
        lines += [f"{n} = {_toml_value(values[n], SETTINGS[n].none_word)}"
                  for n in _section_keys(section)]
        lines.append("")
    return "\n".join(lines)


def save_config(cfg: TrainConfig, directory: str | os.PathLike) -> Path:
    """Writes the resolved ``cfg`` to ``directory/config.toml`` and returns the path."""
    path = Path(directory) / "config.toml"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config_toml(cfg))
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}") from None
    return path
