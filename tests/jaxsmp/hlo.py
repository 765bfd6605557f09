"""Reading compiled HLO text: computations, while loops and the collectives in them.

Structure claims (what is gathered where) are asserted from the compiled module, after
XLA's passes, not from the program JAX lowered.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from jaxsmp.metrics.hlo import ARRAY, computations, group_size, reachable, shape_bytes


@dataclass
class Collective:
    op: str
    result_bytes: int
    operand_bytes: int
    line: str

    @property
    def group(self) -> str:
        """Devices per group (see :func:`jaxsmp.metrics.hlo.group_size`)."""
        return group_size(self.line)


def _collectives(lines: list[str], operand_types: dict[str, str]) -> list[Collective]:
    found = []
    for line in lines:
        m = re.match(r"%?[\w.\-]+ = (.+?) (all-gather|reduce-scatter|all-reduce|all-to-all)"
                     r"(?:-start)?\((.*?)\)", line)
        if m:
            operands = [o.strip().lstrip("%") for o in m.group(3).split(",")]
            found.append(Collective(m.group(2), shape_bytes(m.group(1)),
                                    sum(shape_bytes(operand_types.get(o, "")) for o in operands),
                                    line))
    return found


def _types(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        m = re.match(r"%?([\w.\-]+) = (.+?) [\w\-]+\(", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


@dataclass
class Module:
    """A compiled module's collectives: in each while loop's body, and outside loops."""
    loops: list[list[Collective]]
    outside: list[Collective]

    @classmethod
    def parse(cls, text: str) -> Module:
        comps, entry = computations(text)
        types = {k: t for lines in comps.values() for k, t in _types(lines).items()}
        bodies = [re.search(r"body=%?([\w.\-]+)", l).group(1)
                  for lines in comps.values() for l in lines if " while(" in l]
        in_loops: set[str] = set()
        loops = []
        for body in bodies:
            reach = reachable(comps, body)
            in_loops |= reach
            loops.append([c for name in sorted(reach) for c in _collectives(comps[name], types)])
        outside = [c for name in reachable(comps, entry) - in_loops
                   for c in _collectives(comps[name], types)]
        return cls(loops, outside)


def total(collectives: list[Collective], op: str, field: str = "result_bytes") -> int:
    return int(np.sum([getattr(c, field) for c in collectives if c.op == op]))


def dot_input_dtypes(text: str) -> list[tuple[str, ...]]:
    """For each dot, the element types its operands were computed from: an operand
    produced by a fusion counts as that fusion's parameter types (XLA:CPU turns a bf16
    matmul into converts of bf16 inputs feeding a float32 dot)."""
    comps, _ = computations(text)
    defs = {}
    for lines in comps.values():
        for line in lines:
            m = re.match(r"%?([\w.\-]+) = (\S+) ([\w\-]+)\((.*?)\)(.*)", line)
            if m:
                defs[m.group(1)] = m.group(2, 3, 4, 5)

    def source_types(name: str) -> tuple[str, ...]:
        type_text, op, _, attrs = defs.get(name, ("", "", "", ""))
        called = re.search(r"calls=%?([\w.\-]+)", attrs)
        if op == "fusion" and called:
            params = [l for l in comps.get(called.group(1), []) if " parameter(" in l]
            return tuple(sorted({t for l in params for t, _ in ARRAY.findall(l.split(" = ")[1]
                                                                              .split(" ")[0])}))
        return tuple(t for t, _ in ARRAY.findall(type_text))

    dots = []
    for type_text, op, operands, _ in defs.values():
        if op in ("dot", "convolution"):
            names = [o.strip().lstrip("%") for o in operands.split(",")][:2]
            dots.append(tuple(t for n in names for t in source_types(n)))
    return dots


_COMPUTE = ("dot", "convolution")


def _instructions(lines: list[str]) -> dict[str, tuple[str, list[str], str]]:
    """{name: (opcode, operand names, line)} of one computation."""
    out = {}
    for line in lines:
        m = re.match(r"(?:ROOT )?%?([\w.\-]+) = \S+ ([\w\-]+)\((.*?)\)(.*)", line)
        if m:
            operands = re.findall(r"%([\w.\-]+)", m.group(3))
            out[m.group(1)] = (m.group(2), operands, line)
    return out


def _computes(comps: dict[str, list[str]], instr: tuple[str, list[str], str]) -> bool:
    """A dot or convolution, or a fusion/call containing one."""
    op, _, line = instr
    if op in _COMPUTE:
        return True
    called = re.search(r"calls=%?([\w.\-]+)", line)
    return bool(called) and any(_instructions(comps.get(called.group(1), [])).get(n, ("",))[0]
                                in _COMPUTE for n in _instructions(
                                    comps.get(called.group(1), [])))


def collective_dependencies(text: str, op: str) -> list[dict]:
    """For every ``op`` collective inside a while-loop body: whether its input depends
    on compute (dots) of the same iteration and whether compute of the same iteration
    uses its result. A prefetch, or a gradient reduce-scattered one iteration late, is
    independent both ways, so an asynchronous backend can overlap it with the compute."""
    comps, _ = computations(text)
    bodies = [re.search(r"body=%?([\w.\-]+)", l).group(1)
              for lines in comps.values() for l in lines if " while(" in l]
    found = []
    for body in bodies:
        instrs = _instructions(comps[body])
        users: dict[str, list[str]] = {}
        for name, (_, operands, _) in instrs.items():
            for o in operands:
                users.setdefault(o, []).append(name)

        def reach(start: str, edges) -> set[str]:
            seen, todo = set(), list(edges(start))
            while todo:
                n = todo.pop()
                if n not in seen and n in instrs:
                    seen.add(n)
                    todo += edges(n)
            return seen
        for name, instr in instrs.items():
            if instr[0] in (op, op + "-start"):
                inputs = reach(name, lambda n: instrs[n][1] if n in instrs else [])
                outputs = reach(name, lambda n: users.get(n, []))
                found.append({
                    "input_waits_for_compute": any(_computes(comps, instrs[n]) for n in inputs),
                    "compute_waits_for_result": any(_computes(comps, instrs[n])
                                                    for n in outputs)})
    return found
