"""Step time from the program XLA:GPU compiled: a roofline over its optimized HLO.

``compiled.as_text()`` is parsed into computations (:mod:`hlo_parse`); from the entry
computation every kernel is costed once per execution: a ``while`` loop's body times its
trip count (``known_trip_count`` in its backend config; XLA's ``cost_analysis`` counts a
body once), conditionals at their costliest branch, calls and async wrappers at what they
call, an asynchronous ``fusion-start`` (jax 0.11+) as the fusion it runs. A kernel is

- a GEMM (a fusion around a ``dot``, or a cuBLAS custom call): its FLOPs at the GPU's
  achievable matmul rate, or its operand and result bytes at HBM bandwidth if slower;
- fused attention (cuDNN ``__cudnn$fmha*``): its score-matrix FLOPs (4 x scores x head
  dim forward, half of them causal; the backward 2.5 x) at the attention rate;
- Pallas FlashAttention (``pallas_kernels``' Triton kernels, ``__gpu$xla.gpu.triton``
  named ``flash_attention_forward``, ``_dq`` and ``_dkv``, which GPUs run where cuDNN
  refuses the inputs, e.g. Bloom's ALiBi): the matmuls each runs, 2, 3 and 4 of
  ``2 x b x heads x s_q x s_k x head dim`` FLOPs, at the attention rate, half of them as
  causal (the kernels skip the blocks above the diagonal; jaxsmp's models are causal);
- anything else (elementwise and reduction fusions, copies, slices): its bytes at HBM
  bandwidth. Operands a fusion only slices count at the slice's size, an in-place
  ``dynamic-update-slice`` at its update's.

Collectives are listed with their bytes, dtype and replica groups (:class:`Collective`)
for the communication model to price, and whether the schedule overlaps them with
compute: an asynchronous collective with a GEMM or fused attention between its start
and its done (or, started in one loop iteration and finished in the next, after its
start). Replica groups are read in every format XLA prints: listed (``{{0,1},{2,3}}``),
iota (``[2,4]<=[8]``, ``[2,4]<=[4,2]T(1,0)``) and GSPMD's mesh axes
(``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}``, with ``device_ids=(...)`` or sub-axes
``'axis_0':(2)2``). Each kernel also pays :data:`LAUNCH_SECONDS`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from jaxsmp.metrics.hlo import ARRAY, callees, shape_bytes
from jaxsmp.plan.gpu_target import FP8_GEMM
from jaxsmp.plan.hlo_parse import Instr, as_fusion, backend_config, dims, parse, replica_group

LAUNCH_SECONDS = 2e-6   # per kernel: launch and tail (XLA runs loops as CUDA graphs)
TRITON = "__gpu$xla.gpu.triton"
# pallas_kernels' FlashAttention kernels: score-sized matmuls each runs (forward: QK^T,
# PV; dq: QK^T, dO V^T, dS K; dkv: QK^T, dO V^T, P^T dO, dS^T Q)
PALLAS_ATTENTION = {"flash_attention_forward": 2, "flash_attention_dq": 3,
                    "flash_attention_dkv": 4}
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain",
         "all-gather-done", "all-reduce-done", "collective-permute-done", "copy-done",
         "reduce-scatter-done", "all-to-all-done",
         "async-done", "send-done", "recv-done", "iota", "fusion-done"}
COLLECTIVES = {"all-gather", "reduce-scatter", "all-reduce", "collective-permute",
               "all-to-all", "send", "recv"}


@dataclass(frozen=True)
class Collective:
    """One collective kind on one replica group shape: ``nbytes`` per device (all-gather:
    the gathered result; reduce-scatter: the input; others: the buffer), ``count`` times;
    ``dtype`` of its operands (one entry per dtype of a combined collective);
    ``asynchronous``: a start / done pair; ``overlapped``: asynchronous with compute
    scheduled beside it (see the module)."""
    kind: str
    group_size: int
    stride: int
    nbytes: float
    count: float
    dtype: str = ""
    overlapped: bool = False
    asynchronous: bool = False


@dataclass
class KernelTime:
    """Seconds per step of one device, by kind of kernel, and what they did."""
    matmul: float = 0.0
    attention: float = 0.0
    memory: float = 0.0
    launch: float = 0.0
    matmul_flops: float = 0.0
    attention_flops: float = 0.0
    memory_bytes: float = 0.0
    collectives: list[Collective] = field(default_factory=list)
    # HBM bytes per step of each memory-bound kernel, keyed "computation/name shape"
    memory_kernels: dict[str, float] = field(default_factory=dict)

    @property
    def compute(self) -> float:
        return self.matmul + self.attention + self.memory + self.launch

    def add(self, other: KernelTime, times: float = 1.0) -> None:
        for name in ("matmul", "attention", "memory", "launch", "matmul_flops",
                     "attention_flops", "memory_bytes"):
            setattr(self, name, getattr(self, name) + times * getattr(other, name))
        self.collectives += [Collective(c.kind, c.group_size, c.stride, c.nbytes,
                                        c.count * times, c.dtype, c.overlapped,
                                        c.asynchronous)
                             for c in other.collectives]
        for key, nbytes in other.memory_kernels.items():
            self.memory_kernels[key] = self.memory_kernels.get(key, 0.0) + times * nbytes


@dataclass(frozen=True)
class Rates:
    """What a kernel reaches: FLOP/s of matmuls and of fused attention (cuDNN's), HBM
    bytes/s; ``fp8_matmul_flops``: of cuBLASLt FP8 GEMMs (0: at ``matmul_flops``);
    ``pallas_attention_flops``: of Pallas FlashAttention (0: at ``attention_flops``)."""
    matmul_flops: float
    attention_flops: float
    hbm_bytes: float
    fp8_matmul_flops: float = 0.0
    pallas_attention_flops: float = 0.0


class _Coster:
    """Costs computations of one parsed module on ``rates``, each computation once."""

    def __init__(self, computations: dict[str, list[Instr]], rates: Rates):
        self.comps, self.rates, self._done, self._overlap = computations, rates, {}, {}
        self.shapes = {name: {i.name: i.shape for i in instrs}
                       for name, instrs in computations.items()}

    def computation(self, name: str) -> KernelTime:
        if name not in self._done:
            total = KernelTime()
            for instr in self.comps[name]:
                self.instruction(name, instr, total)
            self._done[name] = total
        return self._done[name]

    def instruction(self, comp: str, i: Instr, total: KernelTime) -> None:
        if i.op in _FREE:
            return
        if i.op == "while":
            total.add(self.computation(callees(i.attrs, "body")[0]), self.trip_count(i))
        elif i.op == "conditional":
            branches = [self.computation(b) for b in callees(i.attrs, "branch_computations")]
            if branches:
                total.add(max(branches, key=lambda k: k.compute))
        elif i.op.removesuffix("-start") in COLLECTIVES:
            total.collectives += self.collective(comp, i)
        elif i.op == "fusion-start":    # one kernel, its done free
            self.kernel(comp, as_fusion(i), total)
        elif i.op in ("call", "async-start") or (i.op.endswith("-start") and "calls=" in i.attrs):
            for name in callees(i.attrs, "to_apply") + callees(i.attrs, "calls"):
                total.add(self.computation(name))
        else:
            self.kernel(comp, i, total)

    def trip_count(self, i: Instr) -> int:
        known = backend_config(i.attrs).get("known_trip_count", {}).get("n")
        if known is not None:
            return int(known)
        # the condition's constant bound, also inside a fusion it calls (XLA:GPU fuses
        # the compare of a loop its collective pipeliner rotated, and drops the count)
        names = callees(i.attrs, "condition")
        names += [c for n in names for j in self.comps[n] for c in callees(j.attrs, "calls")]
        bounds = [int(c.args) for n in names for c in self.comps[n]
                  if c.op == "constant" and c.args.isdigit()]
        if not bounds:
            raise ValueError(f"while loop {i.name}: no known_trip_count and no constant "
                             f"bound in its condition")
        return max(bounds)

    def collective(self, comp: str, i: Instr) -> list[Collective]:
        """``i`` as one :class:`Collective` per dtype of its operands."""
        kind = i.op.removesuffix("-start")
        size, stride = replica_group(i)
        overlapped = i.op.endswith("-start") and i.name in self.overlapped(comp)
        by_dtype: dict[str, float] = {}
        for o in i.operands:
            shape = self.shapes[comp].get(o, "")
            dtype = ARRAY.search(shape)
            key = dtype.group(1) if dtype else ""
            by_dtype[key] = by_dtype.get(key, 0.0) + shape_bytes(shape) * (
                size if kind == "all-gather" else 1)
        return [Collective(kind, size, stride, nbytes, 1.0, dtype, overlapped,
                           i.op.endswith("-start")) for dtype, nbytes in by_dtype.items()]

    def overlapped(self, comp: str) -> set[str]:
        """The asynchronous collectives of ``comp`` with a GEMM or fused attention
        scheduled between their start and done (after the start when the done is in
        the next loop iteration)."""
        if comp not in self._overlap:
            instrs = self.comps[comp]
            compute = [self.is_compute(comp, i) for i in instrs]
            done = {o: k for k, i in enumerate(instrs) if i.op.endswith("-done")
                    for o in i.operands}
            self._overlap[comp] = {
                i.name for k, i in enumerate(instrs) if i.op.endswith("-start")
                and any(compute[k + 1:done.get(i.name, len(instrs))])}
        return self._overlap[comp]

    def is_compute(self, comp: str, i: Instr) -> bool:
        """A GEMM or fused attention kernel."""
        return self.kind(comp, i) != "memory"

    def kind(self, comp: str, i: Instr) -> str:
        """``attention`` (cuDNN's or Pallas' fused attention), ``gemm`` or ``memory``
        (anything else), as :meth:`kernel` prices the instruction."""
        i = as_fusion(i) if i.op == "fusion-start" else i
        target = re.search(r'custom_call_target="([^"]+)"', i.attrs)
        target = target.group(1) if target else ""
        if target.startswith("__cudnn$fmha") or self.pallas_flops(comp, i, target):
            return "attention"
        return "gemm" if self.matmul_flops(comp, i, target) else "memory"

    def kernel(self, comp: str, i: Instr, total: KernelTime) -> None:
        total.launch += LAUNCH_SECONDS
        target = re.search(r'custom_call_target="([^"]+)"', i.attrs)
        target = target.group(1) if target else ""
        cudnn = target.startswith("__cudnn$fmha")
        flops = self.attention_flops(i, target) if cudnn else self.pallas_flops(comp, i, target)
        if flops:
            rate = (0.0 if cudnn else self.rates.pallas_attention_flops) \
                or self.rates.attention_flops
            total.attention += flops / rate
            total.attention_flops += flops
            return
        nbytes = self.kernel_bytes(comp, i)
        flops = self.matmul_flops(comp, i, target)
        memory = nbytes / self.rates.hbm_bytes
        if flops:
            rate = (self.rates.fp8_matmul_flops if target == FP8_GEMM else 0.0) \
                or self.rates.matmul_flops
            total.matmul += max(flops / rate, memory)
            total.matmul_flops += flops
        else:
            total.memory += memory
            total.memory_bytes += nbytes
            total.memory_kernels[f"{comp}/{i.name} {i.shape}"] = nbytes

    def attention_flops(self, i: Instr, target: str) -> float:
        """4 x scores x head dim (QK^T and PV), half of it under a causal mask; the
        backward runs 2.5 forwards' worth (5 matmuls of the forward's 2)."""
        config = backend_config(i.attrs).get("cudnn_fmha_backend_config", {})
        scores = math.prod(int(d) for d in config.get("intermediate_tensor_shape", {})
                           .get("dimensions", []))
        flops = 4.0 * scores * dims(i.shape)[-1]
        if "CAUSAL" in str(config.get("mask_type", "")):
            flops /= 2
        return flops * (2.5 if "Backward" in target else 1.0)

    def pallas_flops(self, comp: str, i: Instr, target: str) -> float:
        """FLOPs of a Pallas FlashAttention kernel (0 for any other kernel): q (operand 0,
        [b, s, heads, d], or [b, s, kv heads, groups, d] for dkv) against k (operand 1,
        [b, s_k, kv heads, d]), causal."""
        if target != TRITON:
            return 0.0
        names = re.findall(r'\bname = "([^"]*)"', i.attrs)
        matmuls = PALLAS_ATTENTION.get(names[-1] if names else "", 0)
        if not matmuls:
            return 0.0
        q = dims(self.shapes[comp].get(i.operands[0], ""))
        k = dims(self.shapes[comp].get(i.operands[1], ""))
        return matmuls * 2.0 * math.prod(q) * k[1] / 2

    def matmul_flops(self, comp: str, i: Instr, target: str) -> float:
        if target.startswith("__cublas"):
            numbers = backend_config(i.attrs).get("gemm_backend_config", {}).get(
                "dot_dimension_numbers", {})
            lhs = dims(self.shapes[comp][i.operands[0]])
            inner = math.prod(lhs[int(d)] for d in numbers.get("lhs_contracting_dimensions", []))
            return 2.0 * math.prod(dims(i.shape)) * inner
        if i.op != "fusion":
            return 0.0
        return sum(self._dot_flops(name) for name in callees(i.attrs, "calls"))

    def _dot_flops(self, name: str) -> float:
        flops = 0.0
        for d in self.comps.get(name, []):
            if d.op in ("dot", "convolution"):
                lhs = dims(self.shapes[name][d.operands[0]])
                found = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", d.attrs)
                contracting = [int(x) for x in found.group(1).split(",") if x] if found else []
                flops += 2.0 * math.prod(dims(d.shape)) * math.prod(lhs[k] for k in contracting)
            elif d.op == "fusion":
                flops += sum(self._dot_flops(n) for n in callees(d.attrs, "calls"))
        return flops

    def kernel_bytes(self, comp: str, i: Instr) -> float:
        """Operand and result bytes; inside a fusion, an operand only sliced counts the
        slices, the buffer of an in-place dynamic-update-slice its update."""
        name = (callees(i.attrs, "calls") or [""])[0] if i.op == "fusion" else ""
        fused = self.comps.get(name)
        if not fused:
            inputs = [shape_bytes(self.shapes[comp].get(o, "")) for o in i.operands]
            if i.op == "dynamic-update-slice":
                return 2.0 * inputs[1]
            if i.op in ("dynamic-slice", "slice"):
                return 2.0 * shape_bytes(i.shape)
            return float(sum(inputs) + shape_bytes(i.shape))
        params = {int(p.args): p.name for p in fused if p.op == "parameter"}
        users: dict[str, list[Instr]] = {}
        for instr in fused:
            for o in instr.operands:
                users.setdefault(o, []).append(instr)
        nbytes = 0.0
        for index, operand in enumerate(i.operands):
            used = users.get(params.get(index, ""), [])
            if used and all(u.op in ("dynamic-slice", "slice", "gather")
                            and u.operands[0] == params[index] for u in used):
                nbytes += sum(shape_bytes(u.shape) for u in used)
            elif not (used and all(u.op == "dynamic-update-slice" and u.operands[0] ==
                                   params[index] for u in used)):
                nbytes += shape_bytes(self.shapes[comp].get(operand, ""))
        root = fused[-1]
        if root.op == "dynamic-update-slice":
            return nbytes + shape_bytes(self.shapes[name].get(root.operands[1], ""))
        return nbytes + shape_bytes(i.shape)


def estimate(text: str, rates: Rates) -> KernelTime:
    """Per-device kernel seconds of one step of the compiled module ``text``."""
    computations, entry = parse(text)
    return _Coster(computations, rates).computation(entry)


def kernel_kinds(text: str) -> dict[str, str]:
    """Each instruction of the module ``text`` by name: ``attention``, ``gemm`` or
    ``memory``, as :func:`estimate` prices it (what a profile's kernels are matched to)."""
    computations, _ = parse(text)
    coster = _Coster(computations, Rates(1.0, 1.0, 1.0))
    return {i.name: coster.kind(comp, i) for comp, instrs in computations.items()
            for i in instrs}


def exposed_collectives(text: str, rates: Rates) -> list[tuple[Collective, str]]:
    """The collectives of the module ``text`` that no GEMM or fused attention runs beside:
    the synchronous ones and the asynchronous ones with none between start and done
    (``Collective.asynchronous`` tells which), each with where it is: ``loop`` (a while
    loop's body), ``first`` (the entry computation, before any compute: nothing to hide
    behind), ``last`` (the entry computation, after all compute) or ``between``. Loops
    and calls count as compute."""
    computations, entry = parse(text)
    coster = _Coster(computations, rates)
    bodies = {b for instrs in computations.values() for i in instrs if i.op == "while"
              for b in callees(i.attrs, "body")}
    found = []
    for comp, instrs in computations.items():
        hidden = coster.overlapped(comp)
        computing = [k for k, i in enumerate(instrs) if i.op in ("while", "call", "conditional")
                     or coster.is_compute(comp, i)]
        done = {o: k for k, i in enumerate(instrs) if i.op.endswith("-done") for o in i.operands}
        for k, i in enumerate(instrs):
            if i.op.removesuffix("-start") not in COLLECTIVES or i.name in hidden:
                continue
            where = ("loop" if comp in bodies else "between" if comp != entry
                     else "first" if all(c > k for c in computing)
                     else "last" if all(c < done.get(i.name, k) for c in computing)
                     else "between")
            found += [(c, where) for c in coster.collective(comp, i)]
    return found
