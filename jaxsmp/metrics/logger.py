"""Metrics of a run written to ``LOG_DIR/metrics.jsonl`` (one JSON object a line:
``{"step": 12, "split": "train", "loss": ..., ...}``) and to TensorBoard event files
in ``LOG_DIR`` (tags ``train/loss``, ``eval/loss``, ...)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    """Appends each record to the JSON-lines file and the TensorBoard writer.
    A resumed run appends to the same files; records of steps after the resumed
    step (written before a stop that lost them) are superseded by the later ones."""

    def __init__(self, log_dir: str | os.PathLike):
        from tensorboardX import SummaryWriter
        self.directory = Path(log_dir)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.directory / METRICS_FILE, "a", encoding="utf-8")
        self._tb = SummaryWriter(str(self.directory))

    def log(self, step: int, split: str, values: dict[str, float | None]) -> None:
        """Writes ``values`` (None and non-finite values are left out) for ``step``."""
        kept = {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}
        self._jsonl.write(json.dumps({"step": step, "split": split, **kept}) + "\n")
        self._jsonl.flush()
        for name, value in kept.items():
            self._tb.add_scalar(f"{split}/{name}", value, step)

    def log_histograms(self, step: int, split: str, values: dict) -> None:
        """Each row ``l`` of each ``[layers, buckets]`` array in ``values`` as the
        TensorBoard histogram ``{split}/{name}/layer_{l}`` with one bucket per column
        (an expert's share of the layer's tokens), bucket ``i`` centred on ``i``."""
        for name, array in values.items():
            for layer, row in enumerate(np.asarray(array, np.float64)):
                ids = np.arange(len(row), dtype=np.float64)
                self._tb.add_histogram_raw(
                    f"{split}/{name}/layer_{layer}", min=0.0, max=float(len(row) - 1),
                    num=float(row.sum()), sum=float((ids * row).sum()),
                    sum_squares=float((ids * ids * row).sum()),
                    bucket_limits=(ids + 0.5).tolist(), bucket_counts=row.tolist(),
                    global_step=step)
        self._tb.flush()

    def close(self) -> None:
        self._jsonl.close()
        self._tb.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(log_dir: str | os.PathLike) -> list[dict]:
    """The records of ``LOG_DIR/metrics.jsonl``; for a step logged twice (a run
    resumed from an earlier checkpoint), the later record."""
    path = Path(log_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {log_dir} (written by a run with --log-dir)")
    latest = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            latest[(record["split"], record["step"])] = record
    return sorted(latest.values(), key=lambda r: (r["split"], r["step"]))
