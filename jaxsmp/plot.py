"""Plot a run's metrics: ``python -m jaxsmp.plot LOG_DIR [--output curves.png]``.

Reads ``LOG_DIR/metrics.jsonl`` (written by the trainer with ``--log-dir``) and
draws the train and eval loss curves above the throughput (tokens/s, with an
MFU scale) against the step, into ``LOG_DIR/curves.png`` by default.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from jaxsmp.metrics.logger import read_metrics


def _series(records: list[dict], split: str, key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in records if r["split"] == split and key in r]
    return [s for s, _ in points], [v for _, v in points]


def _mfu_per_token_per_second(records: list[dict]) -> float | None:
    ratios = [r["mfu"] / r["tokens_per_second"] for r in records
              if r["split"] == "train" and r.get("mfu") and r.get("tokens_per_second")]
    return ratios[-1] if ratios else None


def plot_run(log_dir: str | os.PathLike, output: str | os.PathLike | None = None) -> Path:
    """Writes the loss and throughput figure of ``log_dir``; returns the PNG's path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(log_dir)
    output = Path(output) if output else Path(log_dir) / "curves.png"
    fig, (loss_ax, speed_ax) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                            gridspec_kw={"height_ratios": [3, 2]})
    loss_ax.plot(*_series(records, "train", "loss"), lw=1, alpha=0.8, label="train")
    steps, evals = _series(records, "eval", "loss")
    if steps:
        loss_ax.plot(steps, evals, "o-", ms=4, lw=1.5, label="eval")
    loss_ax.set(ylabel="loss (nats/token)", title=f"{Path(log_dir).resolve().name}: loss")
    loss_ax.grid(alpha=0.3)
    loss_ax.legend()
    speed_ax.plot(*_series(records, "train", "tokens_per_second"), lw=1, color="tab:green")
    speed_ax.set(xlabel="step", ylabel="tokens/s", title="throughput")
    speed_ax.grid(alpha=0.3)
    ratio = _mfu_per_token_per_second(records)
    if ratio:  # MFU is proportional to tokens/s: a second scale on the same curve
        mfu_ax = speed_ax.secondary_yaxis("right", functions=(lambda t: 100 * ratio * t,
                                                              lambda m: m / (100 * ratio)))
        mfu_ax.set_ylabel("MFU (%)")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir")
    parser.add_argument("--output", help="PNG path (default: LOG_DIR/curves.png)")
    args = parser.parse_args(argv)
    try:
        print(f"wrote {plot_run(args.log_dir, args.output)}")
    except FileNotFoundError as err:
        parser.error(str(err))


if __name__ == "__main__":
    main()
