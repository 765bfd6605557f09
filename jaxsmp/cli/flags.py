"""Command-line flags: one per TrainConfig field (``--batch-size 32``; ``none`` for
optional settings) and ``--config run.toml``.

Precedence, lowest first: the field defaults, the example script's defaults (its
model family), the config file, then the flags given.
"""
from __future__ import annotations

import argparse

from jaxsmp.cli.config import FIELDS, SECTIONS, TrainConfig
from jaxsmp.cli.config_file import read_config_file
from jaxsmp.cli.validate import field_kinds


def _converter(name: str):
    """argparse ``type=`` for a field: its scalar type; ``none`` for optional fields."""
    kinds = field_kinds(FIELDS[name])
    scalar = int if int in kinds else float if float in kinds else str

    def convert(text: str):
        if type(None) in kinds and text.lower() == "none":
            return None
        try:
            return scalar(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--{name.replace('_', '-')} takes {scalar.__name__}"
                + (" or none" if type(None) in kinds else "") + f", got {text!r}") from None
    return convert


def _parser(defaults: dict) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Train a language model with jaxsmp.",
                                     argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", help="TOML file with sections "
                        + ", ".join(f"[{s}]" for s in SECTIONS) + "; flags override it")
    for name, f in FIELDS.items():
        flag = "--" + name.replace("_", "-")
        default = defaults.get(name, f.default)
        text = f.metadata["help"]
        if "default" not in text:
            text += f" (default: {'none' if default is None else default})"
        if bool in field_kinds(f):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
        else:
            parser.add_argument(flag, type=_converter(name), help=text)
    return parser


def parse_args(argv: list[str] | None = None, **defaults) -> TrainConfig:
    """The run's config: ``defaults`` (the script's), then ``--config FILE``, then flags.
    Raises :class:`ConfigError` naming a bad value, key or file."""
    given = vars(_parser(defaults).parse_args(argv))
    path = given.pop("config", None)
    from_file = read_config_file(path) if path else {}
    return TrainConfig(**{**defaults, **from_file, **given})
