"""The hand-written GSPMD step ``bench/fsdp_compare.py`` measures jaxsmp against
(``bench/gspmd_fsdp.py``), compiled deviceless for 8 H100s: left to itself GSPMD meets a
GEMM whose split weight is larger than the step's activations by moving the activations
(all-gather over the batch, reduce-scatter of the partial sums); ``gather="weights"``
makes it gather every weight, as ZeRO-3 does."""
import re
import sys
from pathlib import Path

import pytest

from conftest import require_gpu_compiler

require_gpu_compiler()
# appended: the bench folder's collectives.py would shadow the package of that name
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))
import gspmd_fsdp  # noqa: E402

from jaxsmp.plan import gpu_target  # noqa: E402

# GPT-NeoX's block at a width where 8 x 64 tokens of activations (8 x 64 x 256) are
# smaller than each MLP weight (256 x 1024)
WIDTH = gspmd_fsdp.Width(vocab=1024, d=256, heads=4, mlp=1024, layers=2, kind="gelu")
SEQ, BATCH = 64, 8


def _gathered_shapes(gather: str) -> list[tuple[int, ...]]:
    devices = gpu_target.topology("H100-SXM", gpus_per_host=8)
    with gpu_target.compiling_for("H100-SXM"):
        text = gspmd_fsdp.compile_step(devices, {"fsdp": 8}, WIDTH, SEQ, BATCH, "full",
                                       gather=gather).as_text()
    starts = [line.split(" all-gather-start(")[0] for line in text.splitlines()
              if " all-gather-start(" in line]
    return [tuple(int(n) for n in shape.split(","))
            for line in starts for shape in re.findall(r"bf16\[([\d,]+)\]", line)]


@pytest.fixture(scope="module")
def gathered():
    return {g: _gathered_shapes(g) for g in ("auto", "weights")}


ACTIVATIONS = (BATCH, SEQ, WIDTH.d)


def _mlp_weights(shapes) -> list:
    """Gathered MLP matrices, in either orientation (XLA may gather one transposed)."""
    return [s for s in shapes if sorted(s) == sorted((WIDTH.d, WIDTH.mlp))]


def test_plain_gspmd_gathers_the_activations_instead_of_the_mlp_weights(gathered):
    assert gathered["auto"].count(ACTIVATIONS) >= 3, gathered["auto"]
    assert _mlp_weights(gathered["auto"]) == [], gathered["auto"]


def test_gspmd_weights_gathers_the_mlp_weights_and_no_layer_activations(gathered):
    # both matrices, in the forward and again in the rematerialized backward
    assert len(_mlp_weights(gathered["weights"])) >= 4, gathered["weights"]
    assert gathered["weights"].count(ACTIVATIONS) <= 1, gathered["weights"]   # not per layer


def test_an_unknown_gather_mode_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="gather='weight'.*'auto' or 'weights'"):
        gspmd_fsdp.compile_step([], {"fsdp": 8}, WIDTH, SEQ, BATCH, gather="weight")
