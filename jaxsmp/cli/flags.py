"""Command-line flags: one per setting of :data:`~jaxsmp.cli.config.SETTINGS`
(``--batch-size 32``; ``none`` for optional settings) and ``--config run.toml``.

Precedence, lowest first: the setting defaults, the example script's defaults (its
model family), the config file, then the flags given.
"""
from __future__ import annotations

import argparse

from jaxsmp.cli.config import SECTIONS, SETTINGS, Setting, TrainConfig, make_config
from jaxsmp.cli.config_file import read_config_file

_BOOLS = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}


def _converter(s: Setting):
    """argparse ``type=`` for a setting: its scalar type; ``none`` for optional ones."""
    scalar = int if int in s.kinds else float if float in s.kinds else \
        bool if bool in s.kinds else str
    takes = scalar.__name__ + (f" or {s.none_word}" if type(None) in s.kinds else "") \
        + (" or comma-separated ints" if tuple in s.kinds else "")

    def convert(text: str):
        if type(None) in s.kinds and text.lower() == s.none_word:
            return None
        try:
            if tuple in s.kinds and "," in text:
                return tuple(int(c) for c in text.split(","))
            return _BOOLS[text.lower()] if scalar is bool else scalar(text)
        except (KeyError, ValueError):
            raise argparse.ArgumentTypeError(f"{s.flag} takes {takes}, got {text!r}") from None
    return convert


def _add(parser: argparse.ArgumentParser, s: Setting, default) -> None:
    text = s.help
    if "default" not in text:
        text += f" (default: {s.none_word if default is None else default})"
    if s.kinds == (bool,):
        parser.add_argument(s.flag, action=argparse.BooleanOptionalAction, help=text)
    elif bool in s.kinds:  # bool | None: --prefetch, --prefetch off, --prefetch auto
        parser.add_argument(s.flag, nargs="?", const=True, type=_converter(s), help=text)
    else:
        parser.add_argument(s.flag, type=_converter(s), help=text)


def _parser(defaults: dict) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Train a language model with jaxsmp.",
                                     argument_default=argparse.SUPPRESS)
    parser.add_argument("--config", help="TOML file with sections "
                        + ", ".join(f"[{s}]" for s in SECTIONS) + "; flags override it")
    for name, s in SETTINGS.items():
        _add(parser, s, defaults.get(name, s.default))
    return parser


def parse_args(argv: list[str] | None = None, **defaults) -> TrainConfig:
    """The run's config: ``defaults`` (the script's), then ``--config FILE``, then flags.
    Raises :class:`ConfigError` naming a bad value, key or file."""
    given = vars(_parser(defaults).parse_args(argv))
    path = given.pop("config", None)
    from_file = read_config_file(path) if path else {}
    return make_config({**defaults, **from_file, **given})
