"""jaxsmp's training step vs hand-written plain JAX + Flax + optax baselines: the
harness (timing, memory, collectives, tables); the contenders are in
``bench/throughput_contenders.py``.

Each jaxsmp configuration runs beside the baseline that does the same job by hand,
on the same GPT-NeoX module and the same batches, on 8 simulated CPU devices:

    a  jaxsmp Mesh(sdp=8), defaults          vs  jit FSDP (params + moments sharded
                                                 over one axis, GSPMD gathers)
    b  jaxsmp sdp=8, remat="full"            vs  jit FSDP, jax.checkpoint on each layer
    c  jaxsmp Mesh(sdp=4, tp=2)              vs  GSPMD tensor parallel + FSDP: mesh
                                                 ("fsdp", "tp"), Megatron column/row
                                                 split of qkv/out and MLP in/out over tp,
                                                 everything else FSDP over "fsdp";
                                                 once from the parameter shardings
                                                 alone, once with the activations
                                                 between layers pinned to [batch over
                                                 fsdp, replicated over tp]
    d  jaxsmp Mesh(dp=8, sdp=1)              vs  jit DP (params replicated, batch split)
    e  jaxsmp on one device                  vs  single-device jit
    f  jaxsmp sdp=8, prefetch=True (its GPU default; off on CPU): read beside pair a's
       rows of the same run

Every baseline is value_and_grad + clip_by_global_norm(1.0) + the optimizer in one jit
with the state donated (jaxsmp's defaults: fp32, clip 1.0, state donated). Contenders of
one group alternate step by step in one run (``--group all``: every contender of the
workload; ``--group pair``: one pair at a time, freeing it before the next, for models
whose states do not all fit at once); medians after warm-up, never asserted. Per
contender also the compiled step's temporaries and arguments per device
(``memory_analysis()``; XLA:CPU's YNN fusions are switched off so these are honest,
for every contender alike), and with ``--hlo`` the collectives of the compiled step.

Workloads: ``W0`` GPT-NeoX 4 layers, hidden 256, 4 heads, MLP 1024, vocab 1024;
``125m`` the gpt_neox 125m preset. Both seq 256, global batch 16, AdamW fp32, random
tokens; attention_impl the model default ("auto") everywhere, which decides on the shapes
it sees: the global batch in the plain jit programs, the per-device batch in jaxsmp (at
125m, sdp=8: blockwise in jit FSDP, reference in jaxsmp).

On 8 simulated CPU devices sharing a few cores the devices compute one after another,
so these numbers compare overheads (extra copies, collectives, recomputation), not
scaling. ``CPU s/step`` is the process's CPU time per step over all threads (user +
system), the work a contender does; wall time times cores, less that, is the time the
cores sat idle (waiting at the collectives). With ``--hlo`` the compiled steps of
``--hlo-pairs`` (default c) get a table of their collectives: kind, group size, static
count and count per step (ops in a while body times its known trip count) and bytes of
the result shapes.

    python bench/train_throughput.py --workloads W0 --steps 10 --warmup 3 --hlo
    python bench/train_throughput.py --workloads 125m --contenders a --group pair \
        --steps 3 --warmup 1
    python bench/train_throughput.py --workloads 125m --contenders c --group pair \
        --steps 3 --warmup 1 --max-gb 18 --skip "GSPMD TP=2 + FSDP=4"
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import resource
import statistics
import sys
import time
from pathlib import Path

# bench/ holds collectives.py: put the repository first so `collectives` is the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8"
                           + " --xla_cpu_experimental_ynn_fusion_type=").strip()

import jax
import numpy as np
import optax
from throughput_contenders import PAIRS, WORKLOADS

import jaxsmp
from jaxsmp.metrics.hlo import callees, computations, group_size, shape_bytes


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


_INSTR = re.compile(r"^(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def hlo_collectives(text: str) -> dict:
    """{(op, group size, where): [static count, count per step, result bytes per step]}
    from compiled HLO text. Collectives inside while bodies are multiplied by the loop's
    known trip count (XLA's ``known_trip_count``); ``where`` says ``loop xN`` or
    ``loop x?`` (unknown trip count: counted once) or ``top``."""
    comps, entry = computations(text)
    out: dict = {}

    def visit(name: str, mult: int, where: str, stack: tuple) -> None:
        if name not in comps or name in stack:
            return
        for line in comps[name]:
            m = _INSTR.match(line)
            if not m:
                continue
            type_text, op, rest = m.group(2), m.group(3), m.group(4)
            kind = op[:-6] if op.endswith("-start") else op
            if kind in COLLECTIVES and not op.endswith("-done"):
                nbytes = shape_bytes(type_text)
                if op.endswith("-start") and type_text.startswith("("):
                    nbytes //= 2  # (operand, result) tuple: count the result only
                row = out.setdefault((kind, group_size(rest), where), [0, 0, 0])
                row[0] += 1
                row[1] += mult
                row[2] += mult * nbytes
            if op == "while":
                body = re.search(r"body=%?([\w.\-]+)", rest).group(1)
                trip = re.search(r'known_trip_count"?:\{"n":"(\d+)"', rest)
                n = int(trip.group(1)) if trip else 1
                inner = f"loop x{trip.group(1) if trip else '?'}"
                visit(body, mult * n, inner if where == "top" else f"{where}, {inner}",
                      stack + (name,))
                continue
            for callee in callees(rest):
                visit(callee, mult, where, stack + (name,))
    visit(entry, 1, "top", ())
    return out


def print_collectives(workload: str, label: str, table: dict) -> None:
    print(f"\n**{workload}, {label}: collectives per step (compiled HLO)**\n")
    print("| op | group size | where | static count | count per step | MB per step "
          "(result shapes) |")
    print("|---|---|---|---|---|---|")
    if not table:
        print("| (none) | | | 0 | 0 | 0 |")
    order = {k: i for i, k in enumerate(COLLECTIVES)}
    for (op, group, where), (static, per_step, nbytes) in sorted(
            table.items(), key=lambda kv: (order[kv[0][0]], kv[0][1], kv[0][2])):
        print(f"| {op} | {group} | {where} | {static} | {per_step} | {nbytes / 1e6:.2f} |")
    totals: dict = {}
    for (op, _, _), (static, per_step, nbytes) in table.items():
        t = totals.setdefault(op, [0, 0, 0])
        t[0], t[1], t[2] = t[0] + static, t[1] + per_step, t[2] + nbytes
    print("| **total** | | | " + ", ".join(f"{op} {t[0]}" for op, t in totals.items())
          + " | " + ", ".join(f"{op} {t[1]}" for op, t in totals.items())
          + f" | {sum(t[2] for t in totals.values()) / 1e6:.2f} |")


# ---------------------------------------------------------------- measuring

def _cpu_seconds() -> float:
    """CPU time of this process so far, all threads (every simulated device's), user + system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(run, state, batch):
    """(state, wall seconds, CPU seconds, loss) of one step."""
    start, cpu = time.perf_counter(), _cpu_seconds()
    state, loss = run(state, batch)
    loss = float(loss)
    return state, time.perf_counter() - start, _cpu_seconds() - cpu, loss


def analyse(workload: str, label: str, contender, batch, want_hlo: bool) -> dict:
    log(f"{workload}: compiling {label} for memory analysis")
    start = time.perf_counter()
    compiled = contender.lower(contender.state, batch).compile()
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    info = {"temp": mem.temp_size_in_bytes, "args": mem.argument_size_in_bytes,
            "flops": cost.get("flops", float("nan")), "compile_s": time.perf_counter() - start}
    if want_hlo:
        info["hlo"] = hlo_collectives(compiled.as_text())
    log(f"{workload}: {label} compiled in {info['compile_s']:.1f}s, temp "
        f"{info['temp'] / 1e6:.1f} MB, args {info['args'] / 1e6:.1f} MB, "
        f"{info['flops'] / 1e9:.2f} GFLOP (XLA's cost analysis: a loop body counted once) "
        f"per device")
    del compiled
    return info


def _devices(state) -> int:
    return len(jax.tree.leaves(state)[0].sharding.device_set)


def measure_group(workload: str, config, names: list[str], steps: int, warmup: int,
                  batch: int, seq: int, hlo_pairs: list[str], max_bytes: float,
                  skip: list[str] = ()) -> dict:
    """Builds the contenders of ``names`` (pair letters), alternates their steps. A
    contender is analysed but not run when the arguments (states, which stay alive) of
    the group's admitted contenders and its own, plus the largest compiled temporaries
    of one step (steps run one at a time), over all their devices, would exceed
    ``max_bytes`` (simulated devices share the host's memory)."""
    tx = optax.adamw(1e-4)
    rng = np.random.default_rng(0)
    data = [{"tokens": rng.integers(0, config.vocab_size, (batch, seq)).astype(np.int32)}
            for _ in range(warmup + steps)]
    contenders, results, states_bytes, temp_bytes = {}, {}, 0, 0
    for name in names:
        ours_label, make_ours, baselines = PAIRS[name]
        for label, make in baselines + [(ours_label, make_ours)]:
            if label in skip:
                continue
            log(f"{workload}: building {label}")
            contender = make(config, tx)
            r = results[label] = {"pair": name, "ours": label == ours_label,
                                  **analyse(workload, label, contender, data[0],
                                            name in hlo_pairs),
                                  "times": [], "cpu": [], "losses": []}
            n = _devices(contender.state)
            need = states_bytes + r["args"] * n + max(temp_bytes, r["temp"] * n)
            if need > max_bytes:
                r["skipped"] = (f"not run: states + largest temporaries over all devices "
                                f"{need / 1e9:.1f} GB > --max-gb {max_bytes / 1e9:g}")
                log(f"{workload}: {label} {r['skipped']}")
                del contender
                continue
            contenders[label] = contender
            states_bytes += r["args"] * n
            temp_bytes = max(temp_bytes, r["temp"] * n)
    states = {k: c.state for k, c in contenders.items()}
    for c in contenders.values():
        c.state = None
    for i in range(warmup + steps):
        phase = "warm-up" if i < warmup else "step"
        for label, c in contenders.items():
            log(f"{workload}: {phase} {i + 1}/{warmup + steps} {label}")
            states[label], seconds, cpu, loss = timed(c.run, states[label], data[i])
            results[label]["losses"].append(loss)
            if i >= warmup:
                results[label]["times"].append(seconds)
                results[label]["cpu"].append(cpu)
        if i >= warmup:
            log(f"{workload}: after step {i + 1}: " + ", ".join(
                f"{k} {results[k]['times'][-1]:.3f}s" for k in contenders))
    del states, contenders
    gc.collect()
    jax.clear_caches()
    return results


def print_header(workload: str, config, batch: int, seq: int) -> None:
    n = jaxsmp.models.registry.count_params(config)
    print(f"\n### {workload}: {n / 1e6:.1f}M parameters, seq {seq}, global batch {batch}\n")
    print("| pair | contender | tokens/s (median) | tokens/s min–max | step s (median) "
          "| ratio jaxsmp/baseline (of medians; paired median) | CPU s/step (median) "
          "| temp MB/device | args MB/device | loss first→last |")
    print("|---|---|---|---|---|---|---|---|---|---|")


def print_rows(results: dict, batch: int, seq: int) -> None:
    """A jaxsmp row's ratio is against its pair's first baseline; a further baseline's
    row gives jaxsmp's ratio against it in brackets. Paired: the median over steps of
    (baseline step time / jaxsmp step time of the same alternation round)."""
    tokens = batch * seq
    ours = {r["pair"]: r["times"] for r in results.values() if r["ours"] and r["times"]}
    first: dict = {}
    for label, r in results.items():
        if not r["ours"] and r["times"]:
            first.setdefault(r["pair"], r["times"])

    def ratio(base, mine):
        return (f"{statistics.median(base) / statistics.median(mine):.2f}; "
                f"{statistics.median(b / o for b, o in zip(base, mine)):.2f}")
    for label, r in results.items():
        ts = r["times"]
        if not ts:
            print(f"| {r['pair']} | {label} | {r.get('skipped', 'not run')} | | | | | "
                  f"{r['temp'] / 1e6:.1f} | {r['args'] / 1e6:.1f} | |")
            continue
        med = statistics.median(ts)
        if r["ours"]:
            text = ratio(first[r["pair"]], ts) if r["pair"] in first else ""
        elif ts is first[r["pair"]] or r["pair"] not in ours:
            text = ""
        else:
            text = f"(jaxsmp/this: {ratio(ts, ours[r['pair']])})"
        print(f"| {r['pair']} | {label} | {tokens / med:,.0f} | {tokens / max(ts):,.0f}–"
              f"{tokens / min(ts):,.0f} | {med:.3f} | {text} | "
              f"{statistics.median(r['cpu']):.3f} | {r['temp'] / 1e6:.1f} | "
              f"{r['args'] / 1e6:.1f} | {r['losses'][0]:.3f}→{r['losses'][-1]:.3f} |")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["W0", "125m"], choices=WORKLOADS)
    parser.add_argument("--contenders", nargs="+", default=list(PAIRS), choices=list(PAIRS),
                        help="pairs to run (each jaxsmp contender with its baseline)")
    parser.add_argument("--group", choices=("all", "pair"), default="all",
                        help="alternate all contenders of a workload, or one pair at a time")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--skip", nargs="+", default=[], metavar="LABEL",
                        help="contenders (by their label) to leave out")
    parser.add_argument("--max-gb", type=float, default=14.0,
                        help="run no contender whose compiled temporaries + arguments over "
                             "all its devices exceed this (GB); it is analysed, not run")
    parser.add_argument("--hlo", action="store_true",
                        help="print the collectives of the compiled steps of --hlo-pairs")
    parser.add_argument("--hlo-pairs", nargs="+", default=["c"], choices=list(PAIRS))
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} devices; "
          f"medians of {args.steps} steps after {args.warmup} warm-up, contenders alternating "
          f"step by step ({'all at once' if args.group == 'all' else 'one pair at a time'}); "
          f"XLA_FLAGS={os.environ['XLA_FLAGS']}")
    for workload in args.workloads:
        config = WORKLOADS[workload]()
        groups = [args.contenders] if args.group == "all" else [[c] for c in args.contenders]
        hlo_pairs = args.hlo_pairs if args.hlo else []
        print_header(workload, config, args.batch, args.seq)
        tables = {}
        for names in groups:  # rows printed as each group finishes
            results = measure_group(workload, config, names, args.steps, args.warmup,
                                    args.batch, args.seq, hlo_pairs, args.max_gb * 1e9,
                                    args.skip)
            print_rows(results, args.batch, args.seq)
            tables.update({k: r["hlo"] for k, r in results.items() if "hlo" in r})
        for label, table in tables.items():
            print_collectives(workload, label, table)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
