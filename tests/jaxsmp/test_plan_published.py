"""The planner against published multi-node runs it was not fitted on
(``bench/plan_vs_published.py``): the held-out rows, their error and each published
scaling series' trend over node counts (issue 38's targets; the ones not met are strict
xfails that say by how much)."""
import statistics

import pytest

from conftest import bench_module


@pytest.fixture(scope="module")
def bench():
    return bench_module("plan_vs_published")


@pytest.fixture(scope="module")
def result(bench):
    return bench.summary(choice=False)


def test_fit_rows_are_named_and_no_scaling_row_is_fitted_unless_already_a_fit_row(bench):
    names = {r.name for r in bench.RUNS}
    assert bench.FIT <= names and len(bench.FIT) == 8
    scaling = [r for runs in bench.scaling_series().values() for r in runs]
    assert len(scaling) >= 70 and len(bench.scaling_series()) >= 22
    # a scaling row is a fit row only when it is one of the fit rows listed before the
    # series were added
    assert {r.name for r in scaling} & bench.FIT <= {
        "MPT-70b h100 x64 s2048", "MPT-1b h100 x8 s2048", "MPT-30b a100_40 x128 s2048"}
    for r in bench.RUNS + scaling:
        assert "https://" in r.source, r.name
    for runs in bench.scaling_series().values():
        assert len({r.nodes for r in runs}) == len(runs) >= 2


@pytest.mark.slow
def test_the_held_out_median_error_is_within_10_percent(result):
    assert len(result["held_out"]) >= 86
    assert result["median"] <= 0.10
    assert result["median"] == statistics.median(abs(e) for e in result["held_out"].values())


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "largest held-out error 27.1%, the only row of 91 beyond 20%: MPT-70b on 64 "
    "A100-40GB (microbatch 2 on 40 GB, 27% slower per GPU than its 128-GPU row; the "
    "same model and microbatch on 32 A100-80GB over the same network ran 373 tokens/s "
    "per GPU against its 276; its step to 128 GPUs, +36.2%, is odd: its siblings' "
    "median is -1.4%)"))
def test_the_largest_held_out_error_is_within_20_percent(result):
    assert result["worst"] <= 0.20


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "2 of 23 series, where the microbatch grows along the series: MPT-70b A100-40GB "
    "(64 -> 128 GPUs, microbatch 2 -> 4) +36% against +4%, MPT-13b A100-40GB (8 -> 128, "
    "4 -> 16) +18% against +1%; each series' first step is odd, +36.2% and +19.5% where "
    "their siblings' medians are -1.4% and -0.9%"))
def test_every_series_trend_is_within_10_points_of_the_published_one(result):
    assert all(abs(pred - pub) <= 0.10 for pub, pred, _ in result["series"].values())


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "2 of 23 series trends have the other sign, each within 9 points: MPT-13b H100 (1 -> 8 "
    "nodes; its four rows within 1% of each other) gains 0.2% where the planner predicts "
    "-1.9%, each step within 1.2 points; MPT-760m H100 (1 -> 4) gains 7.6% (its 1-node "
    "run the slow one, an odd step) where it predicts -1.3%"))
def test_every_series_trend_has_the_published_sign(result):
    assert all((pub > 0) == (pred > 0) for pub, pred, _ in result["series"].values())


@pytest.mark.slow
def test_every_published_step_its_siblings_agree_with_is_predicted_within_5_points(result):
    """A series' step from one node count to the next against the same step in the other
    series of its stack: the steps the published tables agree with themselves on are
    predicted within 5 points; the odd ones (7 points and more from their siblings'
    median) are the steps behind the targets not met, each named here."""
    compared = [s for s in result["steps"] if s["siblings"]]
    assert len(compared) >= 59
    for step in compared:
        assert step["odd"] == (abs(step["published"] - step["median"]) > 0.07)
        if not step["odd"]:
            assert abs(step["predicted"] - step["published"]) <= 0.05, step
    assert {(s["series"], s["gpus"]) for s in compared if s["odd"]} == {
        ("MPT-70b h100", (32, 64)), ("MPT-30b h100", (8, 16)), ("MPT-760m h100", (8, 16)),
        ("MPT-70b a100_80", (32, 64)), ("MPT-70b a100_40", (64, 128)),
        ("MPT-13b a100_40", (8, 16)), ("MPT-1b a100_40", (16, 32)),
        ("MPT-1b a100_40", (32, 64))}


def test_a_steps_siblings_are_the_same_step_in_its_stacks_other_series(bench):
    runs = bench.scaling_series()
    published = {r.name: r.tokens_per_gpu for rs in runs.values() for r in rs}
    flat = dict.fromkeys(published, 1.0)              # a prediction flat in the node count
    steps = {(s["series"], s["gpus"]): s for s in bench.steps(published, flat)}
    step = steps[("MPT-70b a100_40", (64, 128))]
    gpus = {n: [8 * r.nodes for r in rs] for n, rs in runs.items()}
    same = [n for n, g in gpus.items() if n != "MPT-70b a100_40" and bench.stack(n) == "MPT"
            and (64, 128) in zip(g, g[1:])]
    assert len(step["siblings"]) == len(same) == 7
    assert step["published"] == pytest.approx(376 / 276 - 1)
    assert step["predicted"] == 0.0 and step["odd"]
    # MaxText's two series are each other's siblings; none crosses stacks
    maxtext = steps[("MaxText Llama-2-70B h100", (128, 256))]
    assert len(maxtext["siblings"]) == 1 and bench.stack("MaxText Llama-3-70B h100") == "MaxText"
    assert not steps[("torchtitan Llama-3.1-8B h100_96", (8, 128))]["siblings"]


@pytest.mark.slow
def test_what_holds_today_does_not_get_worse(result):
    """What holds today, so that it does not get worse unnoticed."""
    series = result["series"].values()
    assert all((pub > 0) == (pred > 0) or abs(pred - pub) < 0.09 for pub, pred, _ in series)
    # 2 (was 4) since a step waits for the slowest of its GPUs (STRAGGLER_SPREAD)
    assert sum((pub > 0) == (pred > 0) for pub, pred, _ in series) >= len(series) - 2
    assert sum(abs(pred - pub) <= 0.10 for pub, pred, _ in series) >= len(series) - 2
    assert result["worst"] < 0.275
    # 1 since the kernels are priced at jaxsmp's traced rates and the eager stacks at
    # EAGER of that (6 before, with MPT-125m's series)
    assert sum(abs(e) > 0.20 for e in result["held_out"].values()) <= 1
    assert sum(abs(e) > 0.10 for e in result["held_out"].values()) <= 12
    # the largest scale published: MaxText's ZeRO-3 over 64 to 256 GPUs and replicas of
    # 128 beyond, from 8 to 256 nodes
    for name in ("MaxText Llama-3-70B h100", "MaxText Llama-2-70B h100"):
        pub, pred, _ = result["series"][name]
        assert (pub > 0) == (pred > 0) and abs(pred - pub) <= 0.05, name


@pytest.mark.slow
def test_the_accuracy_plot_draws_every_compared_row_and_marks_the_missed_series(
        bench, result, tmp_path):
    from matplotlib.collections import PathCollection
    fig = bench.plot(result, str(tmp_path / "accuracy.png"))
    assert (tmp_path / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows, trends = fig.axes
    compared = [r for r in result["rows"] if bench.kind(r) != "choice"]
    assert sum(len(c.get_offsets()) for c in rows.collections) == len(compared)
    points = [c for c in trends.collections if isinstance(c, PathCollection)]
    assert len(points) == len(result["series"])
    missed = {name for name, (pub, pred, _) in result["series"].items()
              if (pub > 0) != (pred > 0) or abs(pred - pub) > 0.10}
    assert {t.get_text() for t in trends.texts} == missed


def test_each_published_run_is_priced_with_the_attention_kernel_it_ran(bench):
    """MaxText runs cuDNN's fused attention (the recipes' attention=cudnn_flash_te);
    llm-foundry and torchtitan run FlashAttention-2-class kernels; GPT-NeoX-20B and
    BLOOM ran Megatron's fused softmax, priced as jaxsmp's step would run them."""
    runs = bench.RUNS + bench.scaling_runs()
    kernels = {r.name: r.attention for r in runs}
    assert all(k == "cudnn" for n, k in kernels.items() if n.startswith("MaxText"))
    assert all(k == "flash2" for n, k in kernels.items() if n.startswith(("MPT", "torchtitan")))
    assert kernels["GPT-NeoX-20B"] is kernels["BLOOM-176B"] is None
    assert sum(k == "cudnn" for k in kernels.values()) == 12


def test_each_published_run_reduces_gradients_in_the_dtype_its_run_did(bench):
    """llm-foundry's tables give each run's MP Mode: PURE (bf16 gradient reduction) on
    the A100-40GB rows and the two 70b A100-80GB rows, DEFAULT (composer: float32) on
    the rest; torchtitan reduces in float32 by default; MaxText's recipes do not say
    (jaxsmp's default, bf16)."""
    runs = bench.RUNS + bench.scaling_runs()
    reduced = {r.name: r.candidate.reduced for r in runs if r.candidate}
    pure = {n for n in reduced if n.startswith("MPT") and (
        " a100_40 " in n or n.startswith("MPT-70b a100_80 "))}
    assert len(pure) == 41
    for name, dtype in reduced.items():
        if name.startswith("MPT"):
            assert dtype == ("bf16" if name in pure else "fp32"), name
        elif name.startswith("torchtitan"):
            assert dtype == "fp32", name
        elif name.startswith("MaxText"):
            assert dtype == "bf16", name


def test_torchtitans_runs_are_its_compiled_rows_as_jaxsmps_step_is_compiled(bench):
    """torchtitan's tables publish each Llama 3.1 8B run eager and with torch.compile;
    jaxsmp's step is compiled (XLA fuses the elementwise work), so the compiled rows are
    compared (the eager ones, 5,762 and 5,605 tokens/s per GPU, fuse none of it)."""
    runs = [r for r in bench.scaling_runs() if r.name.startswith("torchtitan Llama-3.1")]
    assert len(runs) == 2
    assert all("FSDP + torch.compile;" in r.source for r in runs)
    assert sorted(round(r.tokens_per_gpu) for r in runs) == [6514, 6667]


@pytest.mark.slow
def test_the_bias_table_groups_every_held_out_row_once(result):
    bias = bench_module("plan_bias")
    grouped = bias.groups(result)
    assert sorted(e for errors in grouped.values() for e in errors) == sorted(
        result["held_out"].values())
    assert {frame for frame, _, _ in grouped} == {"llm-foundry", "MaxText", "torchtitan",
                                                   "Megatron"}
