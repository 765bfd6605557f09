"""The planner's time model against published training throughput: fitted, then held out.

Every row is a published run with its configuration (model, GPUs, interconnect, mesh,
microbatch, activation checkpointing) and its measured tokens per second per GPU,
from the source named in its row. The planner predicts the run's own configuration
(:func:`jaxsmp.plan.evaluate`); both sides are shown as model TFLOP/s per GPU counted
the same way (:func:`jaxsmp.metrics.train_flops_per_token`), so the error is the error
in tokens per second. Megatron's runs published hardware TFLOP/s (its formula with
recomputation), converted back to tokens per second with that formula. Each row also
shows the memory the planner gives jaxsmp's step in that configuration (marked where
it exceeds what XLA may allocate: jaxsmp would not run it as published).

The fitted constants (:class:`jaxsmp.plan.calibration.Fitted`) are fitted on the rows
named in :data:`FIT` (every third row with a published configuration of the list below,
fixed before any fit) and the error is reported on the others (``held out``). The
Llama 2 rows publish only GPU hours (so lower bounds, restarts and evaluation included)
and no configuration: they compare the planner's own choice and are never fitted.

Scaling series (``bench/data/published_scaling.csv``, each row with its source): one
model and configuration family published at several node counts (llm-foundry's MPT
tables from 8 to 512 GPUs, torchtitan's Llama 3.1 8B on 8 and 128 GPUs). Their rows
are held out (except the few that are already fit rows above), and each series' trend,
the change in tokens/s/GPU from its fewest to its most nodes, is compared with the
predicted one.

    python bench/plan_vs_published.py          # the table with the cached constants
    python bench/plan_vs_published.py --fit    # fit on the fit rows, then the table
    python bench/plan_vs_published.py --plot docs/img/planner_accuracy.png
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxsmp
from jaxsmp.models.gpt_neox import GPTNeoXConfig
from jaxsmp.plan import Candidate, cluster, evaluate, plan
from jaxsmp.plan.calibration import FITTED, Fitted
from jaxsmp.plan.candidate import TARGET
from jaxsmp.plan.hardware import GB, GPU, H100_NCCL_SMS, PCIE_GEN5, Cluster, GiB, Node
from jaxsmp.plan.memory import capacity, estimate_memory
from jaxsmp.plan.search import _workload
from jaxsmp.plan.workload import Workload

MPT = "https://github.com/mosaicml/llm-foundry/blob/main/scripts/train/benchmarking/README.md"
TITAN = "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md (2024 version)"
MAXTEXT = "https://catalog.ngc.nvidia.com/orgs/nvidia/teams/dgxc-benchmarking/resources/"
LLAMA2 = "https://arxiv.org/abs/2307.09288 (table 2: GPU hours for 2T tokens)"
DGXC_REMAT = ("https://github.com/NVIDIA/dgxc-benchmarking maxtext/configure.sh: all but the "
              "q, k, v projections recomputed, as jaxsmp's remat save_qkv")


@dataclass(frozen=True)
class Run:
    name: str
    config: object
    node: str
    nodes: int
    seq_len: int
    candidate: Candidate | None   # None: not published, the planner's choice is compared
    tokens_per_gpu: float         # published tokens per second per GPU
    source: str
    global_batch: int = 0         # for the planner's choice
    # the attention kernel the run used, priced at its rate (hardware.ATTENTION_KERNELS):
    # FlashAttention-2 in PyTorch (llm-foundry's flash and Triton kernels, torchtitan's
    # SDPA), cuDNN's in MaxText; None: the kernel jaxsmp's step runs
    attention: str | None = "flash2"
    # remat "full" runs the layer's whole forward again (Semantics.whole_forward): Megatron
    # (GPT-NeoX-20B, BLOOM) and llm-foundry's 2023 tables (PyTorch 2.0's non-reentrant
    # checkpoint reruns the wrapped block whole; it stops early only from 2.1); MaxText
    # (XLA) and torchtitan (PyTorch 2.4+) run only what the backward reads
    whole_forward: bool = False


def _mpt(d: int, layers: int, heads: int) -> GPTNeoXConfig:
    # MPT: LayerNorm, GeLU MLP 4d, sequential residual, vocabulary 50368 (ALiBi in place of
    # rotary: the same matmuls, a little less elementwise work)
    return GPTNeoXConfig(vocab_size=50368, hidden_size=d, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=4 * d,
                         use_parallel_residual=False, max_position_embeddings=8192)


MPT_SIZES = {"350m": (1024, 24, 16), "760m": (1536, 24, 12), "1b": (2048, 24, 16), "3b": (2560, 32, 20), "7b": (4096, 32, 32),
             "13b": (5120, 40, 40), "30b": (7168, 48, 64), "70b": (8192, 80, 64)}
GPU_NODE = {"a100_80": "8xA100-80GB+1600Gbps", "a100_40": "8xA100-40GB+1600Gbps",
            "h100": "8xH100-SXM+3200Gbps", "h100_96": "8xH100-96GB+3200Gbps"}
# torchtitan's Grand Teton hosts: H100 with 96 GB of HBM2e at 2.4 TB/s and 400 Gb/s per
# GPU (their docs/performance.md), otherwise the H100 SXM's data sheet; not registered
# (the bench leaves the planner's tables as they are)
OWN_NODES = {"8xH100-96GB+3200Gbps": Node(
    "8xH100-96GB+3200Gbps",
    GPU("H100-96GB", 989e12, 96 * GiB, 2400 * GB, 450 * GB, 0.801, 0.34, 494.7e12,
        "torchtitan docs/performance.md: H100 96 GB HBM2e, 2.4 TB/s", fp8_flops=1979e12,
        collective_sm_share=H100_NCCL_SMS, cudnn_attention_efficiency=0.51,
        pcie_bandwidth=PCIE_GEN5),
    8, 3200, source="torchtitan docs/performance.md: Grand Teton, 400 Gb/s per GPU")}


def _cluster(name: str, nodes: int) -> Cluster:
    return Cluster(OWN_NODES[name], nodes) if name in OWN_NODES else cluster(name, nodes)


# The dtype each framework reduced gradients in, as published or as its default: the
# gradient reduce-scatter moves 4 bytes an element in float32, 2 in bf16.
# llm-foundry's tables give each run's "MP Mode": PURE (composer: parameters, gradient
# reduction and buffers in bf16) on every A100-40GB row and the two 70b A100-80GB rows,
# DEFAULT (composer: bf16 parameters, float32 gradient reduction) on the rest.
# torchtitan reduces in float32 by default (training.mixed_precision_reduce).
MPT_PURE = frozenset({("70b", "a100_80")})
TORCHTITAN_REDUCE = "fp32"


def mpt_reduce_dtype(size: str, gpu: str) -> str:
    """The gradient reduction dtype of an llm-foundry table row (its MP Mode column)."""
    return "bf16" if gpu == "a100_40" or (size, gpu) in MPT_PURE else "fp32"


def mpt(size: str, gpu: str, gpus: int, seq: int, mbs: int, accum: int, ac: bool,
        tokens: float) -> Run:
    """One row of llm-foundry's benchmark tables: FSDP FULL_SHARD over every GPU, the
    gradients reduced in the row's MP Mode's dtype (:func:`mpt_reduce_dtype`)."""
    note = "" if gpu != "h100" else "; interconnect not stated, 3200 Gbps assumed"
    return Run(f"MPT-{size} {gpu} x{gpus} s{seq}", _mpt(*MPT_SIZES[size]), GPU_NODE[gpu],
               gpus // 8, seq, Candidate(1, gpus, 1, 1, mbs, accum, "full" if ac else "none",
                                         reduce_dtype=mpt_reduce_dtype(size, gpu)),
               tokens, f"{MPT} ({gpu} table, mbs {mbs}, accum {accum}, AC {ac}{note})",
               whole_forward=True)


def megatron_tokens(config, seq: int, tflops: float) -> float:
    """Tokens/s/GPU of a hardware TFLOP/s figure from Megatron's formula
    96 l h^2 (1 + s / 6h + V / 16 l h) FLOPs per token (recomputation included)."""
    h, l, v = config.hidden_size, config.num_hidden_layers, config.vocab_size
    return tflops * 1e12 / (96 * l * h * h * (1 + seq / (6 * h) + v / (16 * l * h)))


def llama3(size: str):
    base = jaxsmp.models.preset("llama", "7b" if size == "8b" else "70b")
    return base.replace(vocab_size=128256, num_key_value_heads=8, rope_theta=500000.0,
                        max_position_embeddings=8192,
                        **({"intermediate_size": 14336} if size == "8b" else {}))


NEOX, BLOOM = jaxsmp.models.preset("gpt_neox", "20b"), jaxsmp.models.preset("bloom", "176b")
LLAMA70 = jaxsmp.models.preset("llama", "70b")
RUNS = [
    Run("GPT-NeoX-20B", NEOX, "8xA100-40GB+800Gbps", 12, 2048,
        Candidate(12, 1, 2, 4, 4, 32, "full", "fp16"), megatron_tokens(NEOX, 2048, 117),
        "https://arxiv.org/abs/2204.06745 sec. 3: 96 A100-40GB, 4 HDR HCAs per node, tp=2 "
        "pp=4 ZeRO-1, 117 hardware TFLOP/s per GPU", attention=None, whole_forward=True),
    Run("BLOOM-176B", jaxsmp.models.preset("bloom", "176b", n_layer=72), "p4de.24xlarge", 48,
        2048,
        Candidate(8, 1, 4, 12, 2, 128, "full", "bf16"), megatron_tokens(BLOOM, 2048, 156),
        "https://huggingface.co/bigscience/bloom: 384 A100-80GB, tp=4 pp=12 dp=8 mbs=2, "
        "156 hardware TFLOP/s per GPU (72 pipeline slots: 70 layers and the embeddings)",
        attention=None, whole_forward=True),
    mpt("70b", "a100_80", 64, 2048, 8, 4, True, 410),
    mpt("30b", "a100_80", 8, 2048, 3, 21, True, 916),
    mpt("13b", "a100_80", 8, 4096, 10, 3, True, 2060),
    mpt("7b", "a100_80", 8, 2048, 6, 2, False, 4641),
    mpt("7b", "a100_80", 8, 8192, 8, 2, True, 3206),
    mpt("3b", "a100_80", 8, 2048, 10, 2, False, 10811),
    mpt("1b", "a100_80", 8, 2048, 14, 4, False, 20513),
    mpt("70b", "h100", 64, 2048, 8, 4, True, 1039),
    mpt("30b", "h100", 8, 2048, 3, 21, True, 2002),
    mpt("13b", "h100", 8, 4096, 10, 3, True, 4717),
    mpt("7b", "h100", 8, 2048, 6, 1, False, 10643),
    mpt("7b", "h100", 8, 8192, 8, 2, True, 6935),
    mpt("3b", "h100", 16, 2048, 10, 3, False, 24142),
    mpt("1b", "h100", 8, 2048, 14, 1, False, 45455),
    mpt("13b", "a100_40", 64, 2048, 16, 1, True, 1976),
    mpt("7b", "a100_40", 128, 2048, 18, 1, True, 3623),
    mpt("30b", "a100_40", 128, 2048, 6, 1, True, 865),
    Run("torchtitan Llama-3-8B", llama3("8b"), "8xA100-80GB+1600Gbps", 8, 8192,
        Candidate(1, 64, 1, 1, 1, 1, "save_matmuls", reduce_dtype=TORCHTITAN_REDUCE), 2973,
        f"{TITAN}: 64 A100-80GB, FSDP2, local batch 1, selective op AC; interconnect not "
        f"stated, 1600 Gbps assumed"),
    Run("torchtitan Llama-3-70B", llama3("70b"), "8xA100-80GB+1600Gbps", 8, 8192,
        Candidate(1, 64, 1, 1, 1, 1, "full", reduce_dtype=TORCHTITAN_REDUCE), 331,
        f"{TITAN}: 64 A100-80GB, FSDP2, local batch 1, full AC"),
    Run("MaxText Llama-2-70B", LLAMA70, "8xH100-SXM+3200Gbps", 8, 4096,
        Candidate(1, 64, 1, 1, 2, 1, "save_qkv"), 1035.97,
        f"{MAXTEXT}maxtext-llama2-70b-dgxc-benchmarking-c: 64 H100, FSDP=64, GBS 128, "
        f"bf16; remat_policy save_qkv_proj ({DGXC_REMAT})", attention="cudnn"),
    Run("MaxText Llama-3-70B x128", llama3("70b"), "8xH100-SXM+3200Gbps", 16, 8192,
        Candidate(1, 128, 1, 1, 2, 1, "save_qkv"), 1052.27,
        f"{MAXTEXT}maxtext-llama3-70b-dgxc-benchmarking-d: 128 H100, FSDP=128, per-device "
        f"batch 2, bf16; remat_policy save_qkv_proj ({DGXC_REMAT})", attention="cudnn"),
]
for size, hours in (("7b", 184_320), ("13b", 368_640), ("70b", 1_720_320)):
    RUNS.append(Run(f"Llama-2-{size.upper()} (GPU hours)", jaxsmp.models.preset("llama", size),
                    "8xA100-80GB+1600Gbps", 64, 4096, None, 2.0e12 / (hours * 3600),
                    f"{LLAMA2}; A100-80GB, 200 Gbps per GPU; configuration not published "
                    f"(64 nodes assumed, the planner's choice compared); a lower bound",
                    global_batch=1024))
# every third row with a published configuration of the list above, as fixed before the
# first fit (named so that rows added later never enter the fit)
FIT = frozenset({"GPT-NeoX-20B", "MPT-30b a100_80 x8 s2048", "MPT-7b a100_80 x8 s8192",
                 "MPT-70b h100 x64 s2048", "MPT-7b h100 x8 s2048", "MPT-1b h100 x8 s2048",
                 "MPT-30b a100_40 x128 s2048", "MaxText Llama-2-70B"})
assert FIT == {r.name for r in [r for r in RUNS if r.candidate is not None][::3]}
SCALING_CSV = Path(__file__).resolve().parent / "data" / "published_scaling.csv"


# the csv's Llama models: (the name of their rows, the model, their attention kernel,
# their gradient reduction dtype: None where the recipe does not say, jaxsmp's default)
# and its ``ac`` column
LLAMAS = {"llama3_8b": ("torchtitan Llama-3.1-8B", llama3("8b"), "flash2", TORCHTITAN_REDUCE),
          "llama3_70b": ("MaxText Llama-3-70B", llama3("70b"), "cudnn", None),
          "llama2_70b": ("MaxText Llama-2-70B", LLAMA70, "cudnn", None)}
REMAT = {"1": "full", "0": "none", "s": "save_matmuls", "q": "save_qkv"}


def scaling_series() -> dict[str, list[Run]]:
    """The scaling series of :data:`SCALING_CSV`, each sorted by GPUs; a row that is
    already in :data:`RUNS` (same name) is that run."""
    known = {r.name: r for r in RUNS}
    series: dict[str, list[Run]] = {}
    lines = [ln for ln in SCALING_CSV.read_text().splitlines() if ln and ln[0] != "#"]
    for name, model, gpu, gpus, seq, mbs, accum, ac, sdp, tokens, source in csv.reader(lines):
        gpus, seq, mbs, accum, sdp = int(gpus), int(seq), int(mbs), int(accum), int(sdp) or int(gpus)
        if model in LLAMAS:
            title, config, kernel, reduce = LLAMAS[model]
            run = Run(f"{title} x{gpus}", config, GPU_NODE[gpu], gpus // 8, seq,
                      Candidate(gpus // sdp, sdp, 1, 1, mbs, accum, REMAT[ac],
                                reduce_dtype=reduce), float(tokens), source, attention=kernel)
        else:
            assert sdp == gpus, f"{name}: llm-foundry's FSDP shards over every GPU"
            run = replace(mpt(model, gpu, gpus, seq, mbs, accum, ac == "1", float(tokens)),
                          source=source.replace("LF ", f"{MPT} "))
        series.setdefault(name, []).append(known.get(run.name, run))
    return {k: sorted(v, key=lambda r: r.nodes) for k, v in series.items()}


def scaling_runs() -> list[Run]:
    """The series' rows that are not in :data:`RUNS`."""
    known = {r.name for r in RUNS}
    return [r for runs in scaling_series().values() for r in runs if r.name not in known]


def predicted(run: Run, fitted: Fitted = FITTED) -> tuple[float, str]:
    """(predicted tokens/s/GPU, the configuration predicted) of a run."""
    target = _cluster(run.node, run.nodes)
    if run.candidate is None:
        best = plan(run.config, target, seq_len=run.seq_len, global_batch=run.global_batch,
                    top=1)[0]
        candidate = best.candidate
    else:
        candidate = run.candidate
    w, semantics = _priced(run)
    step = evaluate(w, candidate, target, semantics, fitted).throughput
    return step.tokens_per_second / target.world, candidate.label()


_PRICED: dict[str, tuple[Workload, object]] = {}


def _priced(run: Run) -> tuple[Workload, object]:
    """The workload and step semantics a run is priced with (one each per run, so a fit's
    many evaluations reuse the workload's traced counts)."""
    if run.name not in _PRICED:
        _PRICED[run.name] = (Workload(run.config, run.seq_len, run.attention),
                             replace(TARGET, whole_forward=run.whole_forward))
    return _PRICED[run.name]


def jaxsmp_memory(run: Run) -> tuple[float, float]:
    """(GiB per GPU the planner gives jaxsmp's step in the run's published configuration,
    GiB XLA may allocate there): where the first is larger, jaxsmp would not run the
    configuration as published (its pre-flight would ask for remat or a smaller
    microbatch), and the row compares the time model alone."""
    w, semantics = _priced(run)
    memory = estimate_memory(w, run.candidate, semantics)
    gpu = _cluster(run.node, run.nodes).node.gpu
    return memory.total / GiB, capacity(gpu.memory_bytes) / GiB


def error(run: Run, fitted: Fitted = FITTED) -> float:
    return predicted(run, fitted)[0] / run.tokens_per_gpu - 1


def fit(runs: list[Run], start: Fitted = FITTED) -> Fitted:
    """Coordinate search minimising the mean absolute relative error over ``runs``."""
    def loss(f: Fitted) -> float:
        return statistics.fmean(abs(error(r, f)) for r in runs)
    best, best_loss = start, loss(start)
    for step in (0.1, 0.03, 0.01):
        improved = True
        while improved:
            improved = False
            for name in ("matmul", "attention", "overlap"):
                for sign in (-1, 1):
                    value = round(getattr(best, name) + sign * step, 4)
                    if not 0 < value <= (1.0 if name == "overlap" else 1.5):
                        continue
                    trial = replace(best, **{name: value})
                    if (trial_loss := loss(trial)) < best_loss:
                        best, best_loss, improved = trial, trial_loss, True
    return best


def kind(run: Run) -> str:
    return "fit" if run.name in FIT else ("held out" if run.candidate else "choice")


def trend(runs: list[Run], tokens: dict[str, float]) -> float:
    """The change in tokens/s/GPU from the series' fewest nodes to its most."""
    return tokens[runs[-1].name] / tokens[runs[0].name] - 1


def summary(fitted: Fitted = FITTED, choice: bool = True) -> dict:
    """Every row's prediction, the held-out errors and each series' trends (the check
    ``tests/jaxsmp/test_plan_published.py`` and the table below read); ``choice``: also
    the rows that compare the planner's own choice (a search each)."""
    rows = [r for r in RUNS + scaling_runs() if choice or kind(r) != "choice"]
    predictions = {r.name: predicted(r, fitted) for r in rows}
    held = {r.name: predictions[r.name][0] / r.tokens_per_gpu - 1
            for r in rows if kind(r) == "held out"}
    published = {r.name: r.tokens_per_gpu for r in rows}
    tokens = {name: p[0] for name, p in predictions.items()}
    series = {name: (trend(runs, published), trend(runs, tokens),
                     any(r.name in FIT for r in runs))
              for name, runs in scaling_series().items()}
    absolute = sorted(abs(e) for e in held.values())
    return {"rows": rows, "predictions": predictions, "held_out": held,
            "median": statistics.median(absolute), "worst": absolute[-1], "series": series}


def table(fitted: Fitted) -> dict:
    """Prints every row, the held-out summary and the trends; returns :func:`summary`'s."""
    result = summary(fitted)
    print("| run | set | GPUs | configuration | published tok/s/GPU (TFLOP/s) | predicted "
          "tok/s/GPU (TFLOP/s) | error | jaxsmp GiB/GPU (of) |")
    print("|---|---|---|---|---|---|---|---|")
    unfit = []
    for run in result["rows"]:
        tokens, label = result["predictions"][run.name]
        per_token = _workload(run.config, run.seq_len).model_flops_per_token / 1e12
        err = tokens / run.tokens_per_gpu - 1
        memory = "the planner's choice"
        if run.candidate:
            used, of = jaxsmp_memory(run)
            memory = f"{used:.0f} ({of:.0f})" + " too much" * (used > of)
            unfit += [run.name] * (used > of)
        print(f"| {run.name} | {kind(run)} | {run.nodes} x {run.node} | {label} | "
              f"{run.tokens_per_gpu:,.0f} ({run.tokens_per_gpu * per_token:.0f}) | "
              f"{tokens:,.0f} ({tokens * per_token:.0f}) | {err:+.1%} | {memory} |")
    print(f"\nheld out ({len(result['held_out'])} runs): median |error| "
          f"{result['median']:.1%}, largest {result['worst']:.1%}; constants: {fitted}")
    compared = sum(1 for r in result["rows"] if r.candidate)
    print(f"{len(unfit)} of {compared} published configurations need more memory in jaxsmp's "
          "step than XLA may allocate (the planner's estimate): jaxsmp would run them with "
          "remat or a smaller microbatch; their rows compare the time model alone\n")
    print("| series | nodes | published trend | predicted trend | same sign | "
          "difference (points) |")
    print("|---|---|---|---|---|---|")
    series = scaling_series()
    for name, (pub, pred, fitted_row) in result["series"].items():
        runs = series[name]
        same = "yes" if (pub > 0) == (pred > 0) else "no"
        note = " (has a fit row)" if fitted_row else ""
        print(f"| {name}{note} | {runs[0].nodes}-{runs[-1].nodes} | {pub:+.1%} | {pred:+.1%} "
              f"| {same} | {100 * abs(pred - pub):.1f} |")
    print()
    for run in result["rows"]:
        print(f"- {run.name}: {run.source}")
    return result


def plot(result: dict, path: str):
    """Two panels: every row with a published configuration, predicted against published
    model TFLOP/s per GPU (fit rows filled, held-out hollow, 10% and 20% bands); each
    scaling series' trend, predicted against published (the 10-point band)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (rows, trends) = plt.subplots(1, 2, figsize=(12, 5.5))
    colors = {}
    for run in result["rows"]:
        if kind(run) == "choice":
            continue
        per_token = _workload(run.config, run.seq_len).model_flops_per_token / 1e12
        x, y = run.tokens_per_gpu * per_token, result["predictions"][run.name][0] * per_token
        gpu = _cluster(run.node, 1).node.gpu.name
        color = colors.setdefault(gpu, f"C{len(colors)}")
        fit = kind(run) == "fit"
        rows.scatter(x, y, s=28, color=color if fit else "none", edgecolors=color,
                     label=f"{gpu} ({'fit' if fit else 'held out'})")
    line = [80, 600]
    rows.plot(line, line, "k-", lw=0.8)
    for band, style in ((0.1, "--"), (0.2, ":")):
        for sign in (-1, 1):
            rows.plot(line, [v * (1 + sign * band) for v in line], "k" + style, lw=0.7)
    handles = dict(sorted(zip(*rows.get_legend_handles_labels()[::-1]), key=lambda t: t[0]))
    rows.legend(handles.values(), handles.keys(), fontsize=7, loc="upper left")
    rows.set(xscale="log", yscale="log", xlabel="published model TFLOP/s per GPU",
             ylabel="predicted",
             title=f"held out: median |error| {result['median']:.1%}, "
                   f"largest {result['worst']:.1%} (bands: 10%, 20%)")
    ticks = [100, 150, 200, 300, 400, 500]
    for axis in (rows.xaxis, rows.yaxis):
        axis.set_ticks(ticks, [str(t) for t in ticks])
        axis.set_minor_locator(matplotlib.ticker.NullLocator())
    misses = []
    for name, (pub, pred, _) in result["series"].items():
        miss = (pub > 0) != (pred > 0) or abs(pred - pub) > 0.10
        trends.scatter(100 * pub, 100 * pred, s=28, color="C3" if miss else "C0")
        misses += [(pred, pub, name)] * miss
    # labels staggered from the highest prediction down: the misses near 0 overlap
    for k, (pred, pub, name) in enumerate(sorted(misses, reverse=True)):
        trends.annotate(name, (100 * pub, 100 * pred), fontsize=7,
                        xytext=(6, 14 - 11 * k), textcoords="offset points",
                        arrowprops={"arrowstyle": "-", "lw": 0.4})
    span = [-15, 40]
    trends.plot(span, span, "k-", lw=0.8)
    trends.fill_between(span, [v - 10 for v in span], [v + 10 for v in span], alpha=0.1)
    trends.axhline(0, color="grey", lw=0.5)
    trends.axvline(0, color="grey", lw=0.5)
    trends.set(xlabel="published trend, fewest to most nodes (%)", ylabel="predicted (%)",
               title="scaling series (red: wrong sign or beyond 10 points)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fit", action="store_true", help="fit the constants on the fit rows")
    p.add_argument("--plot", metavar="PNG", help="also draw the table and the trends")
    args = p.parse_args()
    fitted = FITTED
    if args.fit:
        fitted = fit([r for r in RUNS if r.name in FIT], Fitted(1.0, 1.0, 1.0))
        print(f"fitted on {sorted(FIT)}:\n    FITTED = {fitted}\n")
    result = table(fitted)
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
