"""``bench/pallas_sweep.py``, the Pallas attention launch sweep, kept working on CPU: its
``--smoke`` run (interpret mode, tiny shapes) times every kernel at each setting, with
the causal mask on the diagonal tiles and on every tile, and writes its files."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_sweep_times_each_kernel_both_ways_and_writes_its_files(tmp_path):
    done = subprocess.run([sys.executable, "bench/pallas_sweep.py", "--smoke", "--budget",
                           "600", "--out", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    data = json.loads((tmp_path / "pallas_sweep.json").read_text())
    assert data["sweep"] and all("ms" in row for row in data["sweep"]), data["sweep"]
    kernels = {(row["kernel"], row["every_tile"]) for row in data["compare"] if "ms" in row}
    assert kernels == {(k, every) for k in ("forward", "dq", "dkv") for every in (False, True)}
    assert [row["impl"] for row in data["end_to_end"] if "ms" in row] == ["pallas", "pallas"]
    assert "## End to end" in (tmp_path / "pallas_sweep.md").read_text()
