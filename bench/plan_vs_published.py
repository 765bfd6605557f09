"""The planner's predictions beside published training throughput, untuned.

For each published run: the TFLOP/s per GPU the planner predicts for the run's own
configuration on its hardware, and the configuration the planner would choose there with
its prediction. Published numbers are as their sources count them: "hardware" includes
the recomputation of activation checkpointing (Megatron/GPT-NeoX's formula), "model"
does not; the Llama 2 rows derive model TFLOP/s from the paper's GPU hours, which
include everything that ran (restarts, evaluation), so they are lower bounds.

Megatron runs (tp x pp x ZeRO-1 dp) are evaluated as jaxsmp's dp x tp x pp with the
``simple`` schedule (the same bubble as Megatron's 1F1B, without jaxsmp's 1F1B stage
recomputation); their memory is not checked (ZeRO-1 is not a jaxsmp layout).

    python bench/plan_vs_published.py
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxsmp  # noqa: E402
from jaxsmp.models.gpt_neox import GPTNeoXConfig  # noqa: E402
from jaxsmp.plan import Candidate, cluster, evaluate, plan  # noqa: E402
from jaxsmp.plan.search import _workload  # noqa: E402

LLAMA2_TOKENS = 2.0e12


@dataclass(frozen=True)
class Run:
    name: str
    config: object
    node: str
    nodes: int
    seq_len: int
    global_batch: int
    published: Candidate | None   # the run's configuration, when published
    tflops: float | None          # published TFLOP/s per GPU (None: derived below)
    kind: str                     # "hardware" or "model"
    source: str
    gpu_hours: float | None = None


def _mpt(d: int, layers: int, heads: int) -> GPTNeoXConfig:
    # MPT: GeLU MLP 4d, sequential residual, vocabulary 50432 (ALiBi and tied embeddings
    # differ from GPT-NeoX but not in FLOPs or memory that matter here)
    return GPTNeoXConfig(vocab_size=50432, hidden_size=d, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=4 * d,
                         use_parallel_residual=False)


RUNS = [
    Run("GPT-NeoX-20B", jaxsmp.models.preset("gpt_neox", "20b"), "8xA100-40GB+800Gbps", 12,
        2048, 1536, Candidate(12, 1, 2, 4, 4, 32, "full", "fp16", "simple"), 117, "hardware",
        "Black et al. 2022, sec. 3: 96 A100-40GB, 4 HDR HCAs per node, tp=2 pp=4 ZeRO-1, "
        "117 TFLOP/s per GPU"),
    Run("BLOOM-176B", jaxsmp.models.preset("bloom", "176b", n_layer=72), "p4de.24xlarge", 48,
        2048, 2048, Candidate(8, 1, 4, 12, 2, 128, "full", "bf16", "simple"), 156, "hardware",
        "BigScience 2022 / GENCI: 384 A100-80GB, 4 x 100 Gbps Omni-Path per node, tp=4 pp=12 "
        "dp=8 mbs=2, 156 TFLOP/s per GPU (72 pipeline slots for 70 layers + embeddings)"),
    Run("MPT-30B (MosaicML)", _mpt(7168, 48, 64), "8xA100-80GB+1600Gbps", 1, 2048, 504,
        Candidate(1, 8, 1, 1, 3, 21, "full", "bf16"), 0.553 * 312, "model",
        "llm-foundry scripts/train/benchmarking: FSDP FULL_SHARD, checkpointing, MFU 55.3%"),
    Run("MPT-70B (MosaicML)", _mpt(8192, 80, 64), "8xA100-80GB+1600Gbps", 8, 2048, 2048,
        Candidate(1, 64, 1, 1, 8, 4, "full", "bf16"), 0.5333 * 312, "model",
        "llm-foundry scripts/train/benchmarking: FSDP FULL_SHARD, checkpointing, MFU 53.3%"),
]
for size, hours in (("7b", 184_320), ("13b", 368_640), ("70b", 1_720_320)):
    RUNS.append(Run(f"Llama-2-{size.upper()}", jaxsmp.models.preset("llama", size),
                    "8xA100-80GB+1600Gbps", 64, 4096, 1024, None, None, "model",
                    "Touvron et al. 2023, table 2: GPU hours for 2T tokens on A100-80GB, "
                    "200 Gbps per GPU; configuration not published (64 nodes assumed)",
                    gpu_hours=hours))


def published(run: Run) -> float:
    if run.tflops is not None:
        return run.tflops
    w = _workload(run.config, run.seq_len)
    return w.model_flops_per_token * LLAMA2_TOKENS / (run.gpu_hours * 3600) / 1e12


def predicted(run: Run, candidate: Candidate) -> float:
    target = cluster(run.node, run.nodes)
    p = evaluate(_workload(run.config, run.seq_len), candidate, target)
    t = p.throughput
    return t.hardware_tflops_per_gpu if run.kind == "hardware" else t.model_tflops_per_gpu


def main() -> None:
    print("| run | hardware | published config | published TFLOP/s/GPU | predicted for it "
          "| error | planner's choice | predicted |")
    print("|---|---|---|---|---|---|---|---|")
    for run in RUNS:
        target = cluster(run.node, run.nodes)
        pub = published(run)
        best = plan(run.config, target, seq_len=run.seq_len, global_batch=run.global_batch,
                    precision=run.published.precision if run.published else "bf16", top=1)
        best_tflops = predicted(run, best[0].candidate) if best else float("nan")
        if run.published is not None:
            mine = predicted(run, run.published)
            cells = [run.published.label(), f"{mine:.0f}", f"{mine / pub - 1:+.0%}"]
        else:
            cells = ["n/a", "", f"{best_tflops / pub - 1:+.0%} (choice)"]
        choice = best[0].candidate.label() if best else "nothing fits"
        print(f"| {run.name} | {target} | {cells[0]} | {pub:.0f} ({run.kind}) | {cells[1]} "
              f"| {cells[2]} | {choice} | {best_tflops:.0f} |")
    print()
    for run in RUNS:
        print(f"- {run.name}: {run.source}")


if __name__ == "__main__":
    main()
