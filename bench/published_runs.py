"""The published training runs ``bench/plan_vs_published.py`` predicts: each with its
model, cluster, configuration, measured tokens per second per GPU and source; the fit
rows named in :data:`FIT`; and the scaling series (``bench/data/published_scaling.csv``),
one model and configuration family at several node counts."""
from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import jaxsmp
from jaxsmp.models.gpt_neox import GPTNeoXConfig
from jaxsmp.plan import Candidate, cluster
from jaxsmp.plan.hardware import GB, GPU, H100_NCCL_SMS, PCIE_GEN5, Cluster, GiB, Node

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
    # the run's step was compiled, its elementwise work fused between the GEMMs, as
    # jaxsmp's is: MaxText (XLA) and torchtitan's torch.compile rows; else eager PyTorch
    # or Megatron, priced at plan_vs_published.EAGER of the compiled step's throughput
    compiled: bool = False


def _mpt(d: int, layers: int, heads: int) -> GPTNeoXConfig:
    # MPT: LayerNorm, GeLU MLP 4d, sequential residual, vocabulary 50368 (ALiBi in place of
    # rotary: the same matmuls, a little less elementwise work)
    return GPTNeoXConfig(vocab_size=50368, hidden_size=d, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=4 * d,
                         use_parallel_residual=False, max_position_embeddings=8192)


MPT_SIZES = {"125m": (768, 12, 12), "350m": (1024, 24, 16), "760m": (1536, 24, 12), "1b": (2048, 24, 16), "3b": (2560, 32, 20), "7b": (4096, 32, 32),
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
        f"bf16; remat_policy save_qkv_proj ({DGXC_REMAT})", attention="cudnn", compiled=True),
    Run("MaxText Llama-3-70B x128", llama3("70b"), "8xH100-SXM+3200Gbps", 16, 8192,
        Candidate(1, 128, 1, 1, 2, 1, "save_qkv"), 1052.27,
        f"{MAXTEXT}maxtext-llama3-70b-dgxc-benchmarking-d: 128 H100, FSDP=128, per-device "
        f"batch 2, bf16; remat_policy save_qkv_proj ({DGXC_REMAT})", attention="cudnn",
        compiled=True),
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
                                reduce_dtype=reduce), float(tokens), source, attention=kernel,
                      compiled=True)   # MaxText's XLA, torchtitan's torch.compile rows
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
