"""The run's tokenizer and its train and held-out batches: a prepared (memory-mapped)
dataset, or text tokenized in memory (a file, a directory, or the bundled docs)."""
from __future__ import annotations

from dataclasses import dataclass

from jaxsmp.cli.config import ConfigError, TrainConfig
from jaxsmp.data import (
    PackedBatches,
    TokenBatches,
    TokenDataset,
    is_prepared,
    load_corpus,
    load_tokenizer,
)
from jaxsmp.data.loader import Source
from jaxsmp.data.tokenizer import ByteTokenizer, Tokenizer, has_tokenizer


@dataclass
class RunData:
    train: Source
    eval: Source | None
    vocab_size: int  # of the tokenizer the tokens come from
    description: str  # for the run's header line
    identity: dict  # recorded with checkpoints: what batch i is made of

    def __post_init__(self) -> None:
        self.identity = {**self.identity, "batch_size": self.train.batch_size,
                         "seq_len": self.train.seq_len}


def run_tokenizer(cfg: TrainConfig) -> Tokenizer | None:
    """``--tokenizer``; else the tokenizer of ``--init-from-hf``'s directory if it has
    one; else None (the byte-level default, or a prepared dataset's own)."""
    if cfg.tokenizer is not None:
        return load_tokenizer(cfg.tokenizer)
    if cfg.init_from_hf and has_tokenizer(cfg.init_from_hf):
        return load_tokenizer(cfg.init_from_hf)
    return None


def _prepared(cfg: TrainConfig, tokenizer: Tokenizer | None) -> RunData:
    dataset = TokenDataset(cfg.data)
    if tokenizer is not None and tokenizer.identity != dataset.tokenizer:
        raise ConfigError(f"{cfg.data} was tokenized with {dataset.tokenizer} "
                         f"({dataset.index.get('tokenizer_source')}), not with {tokenizer.name} "
                         f"({tokenizer.identity}); prepare it again or drop --tokenizer")
    train = PackedBatches(dataset, "train", cfg.batch_size, cfg.seq_len, cfg.seed)
    start, stop = dataset.split("val")
    held_out = None
    if cfg.eval_every:
        if stop - start < cfg.seq_len:
            raise ConfigError(f"{cfg.data} has {stop - start} validation tokens, fewer than "
                             f"seq_len={cfg.seq_len}; prepare it with a larger --val-fraction "
                             f"or pass --eval-every 0")
        held_out = PackedBatches(dataset, "val", cfg.batch_size, cfg.seq_len, cfg.seed + 1)
    description = (f"{cfg.data}: {train.rows_per_epoch:,} rows of {cfg.seq_len} tokens "
                   f"({dataset.index.get('tokenizer_source')})")
    return RunData(train, held_out, dataset.vocab_size, description,
                   {"data": str(dataset.directory.resolve()), "tokenizer": dataset.tokenizer,
                    "seed": cfg.seed})


def run_data(cfg: TrainConfig) -> RunData:
    """Train and held-out batches of ``cfg.data`` with the run's tokenizer; a path that
    holds no data or tokenizer, or too few tokens, is a :class:`ConfigError`."""
    try:
        return _run_data(cfg)
    except (ValueError, OSError) as err:
        raise ConfigError(str(err)) from err


def _run_data(cfg: TrainConfig) -> RunData:
    tokenizer = run_tokenizer(cfg)
    if is_prepared(cfg.data):
        return _prepared(cfg, tokenizer)
    tokenizer = tokenizer or ByteTokenizer()
    batches = TokenBatches(tokenizer.encode(load_corpus(cfg.data)), cfg.batch_size,
                           cfg.seq_len, cfg.seed)
    train, held_out = batches.split()
    description = f"{cfg.data or 'Python docs'} ({tokenizer.name}, {len(batches.tokens):,} tokens)"
    return RunData(train, held_out if cfg.eval_every else None, tokenizer.vocab_size,
                   description, {"data": cfg.data, "tokenizer": tokenizer.identity,
                                 "seed": cfg.seed})
