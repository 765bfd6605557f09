"""Settings that only the devices, the data or the model can judge: each ends the run
with one ``error: ...`` line naming the value, before the step compiles."""
import subprocess
import sys
from pathlib import Path

import pytest

from jaxsmp.cli import ConfigError, parse_args, run

ROOT = Path(__file__).parents[2]
FAST = ["--steps", "1", "--eval-every", "0", "--no-progress", "--seq-len", "32"]


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "10"], r"global batch size 10 is not divisible by dp\*ep\*sdp \(8\) x "
                             r"microbatches \(1\) = 8; use a multiple of 8"),
    (["--batch-size", "24", "--microbatches", "2"], r"size 24 .* = 16; use a multiple of 16"),
    (["--tp", "3"], r"mesh degrees .*'tp': 3.* do not divide the 8 devices"),
    (["--data", "/nonexistent/corpus"], r"data path '/nonexistent/corpus' is neither"),
    (["--tokenizer", "/nonexistent/tok.json"], r"tokenizer '/nonexistent/tok.json' is neither"),
    (["--init-from-hf", "/nonexistent/hf"], r"/nonexistent/hf/config.json not found"),
    (["--seq-len", "1000000"], r"corpus of \d+ tokens is shorter than seq_len=1000000"),
    (["--vocab-size", "10"], r"vocab_size=10 is smaller than the tokenizer's 256 tokens"),
    (["--pp", "8"], r"needs at least pp x chunks = 8 x 1 = 8 stacked layers .* has 4"),
    (["--pp", "4", "--pipeline", "virtual"], r"'virtual' needs microbatches >= stages"),
    (["--checkpoint-dir", "/proc/jaxsmp"], r"cannot write /proc/jaxsmp/config.toml"),
])
def test_a_setting_the_run_cannot_serve_is_a_config_error(argv, message):
    with pytest.raises(ConfigError, match=message):
        run(parse_args(FAST + argv))


def test_an_indivisible_batch_is_one_error_line_and_status_2():
    proc = subprocess.run([sys.executable, "-m", "jaxsmp.train", *FAST, "--batch-size", "10"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith(("error", "Traceback"))]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines == ["error: global batch size 10 is not divisible by dp*ep*sdp (8) x "
                     "microbatches (1) = 8; use a multiple of 8"]
