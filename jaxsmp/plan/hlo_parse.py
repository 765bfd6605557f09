"""The optimized HLO text XLA prints, parsed into instructions for :mod:`hlo_cost`.

One :class:`Instr` per ``%name = shape op(operands), attrs`` line of each computation;
an asynchronous ``fusion-start`` read as the fusion it runs (:func:`as_fusion`), backend
configs as JSON (:func:`backend_config`), a collective's first replica group as (size,
stride).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from jaxsmp.metrics.hlo import ARRAY, computations, first_replica_group


@dataclass(frozen=True)
class Instr:
    name: str
    shape: str
    op: str
    operands: tuple[str, ...]
    attrs: str
    args: str = ""   # the text between the parentheses (a constant's value)


def dims(shape: str) -> list[int]:
    found = ARRAY.search(shape)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def _closing(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced parentheses in HLO line: {text[:200]}")


def _instruction(line: str) -> Instr | None:
    body = line.strip().removeprefix("ROOT ")
    if not body.startswith("%") or " = " not in body:
        return None
    name, rest = body[1:].split(" = ", 1)
    end = _closing(rest, 0) + 1 if rest.startswith("(") else rest.index(" ")
    shape, rest = rest[:end], rest[end:].lstrip()
    paren = rest.index("(")
    close = _closing(rest, paren)
    operands = tuple(re.findall(r"%([\w.\-]+)", rest[paren:close]))
    return Instr(name, shape, rest[:paren], operands, rest[close + 1:], rest[paren + 1:close])


def parse(text: str) -> tuple[dict[str, list[Instr]], str]:
    """(computations by name, the entry computation's name) of an HLO module's text."""
    lines, entry = computations(text)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return {name: [i for line in body if (i := _instruction(line))]
            for name, body in lines.items()}, entry


def as_fusion(start: Instr) -> Instr:
    """An asynchronous ``fusion-start`` (XLA:GPU in jax 0.11+ wraps some fusions, e.g.
    the in-place updates of a loop's stacked residuals, in a start / done pair) as the
    fusion it runs: its operands, and its result, the second element of the start's
    ``((operands), result, context)`` tuple. The done moves nothing of its own."""
    inner = start.shape.strip()[1:-1]
    depth, parts, begin = 0, [], 0
    for k, ch in enumerate(inner):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(inner[begin:k])
            begin = k + 1
    parts.append(inner[begin:])
    return Instr(start.name, parts[1].strip() if len(parts) > 2 else start.shape, "fusion",
                 start.operands, start.attrs, start.args)


def backend_config(attrs: str) -> dict:
    found = re.search(r"backend_config=(\{.*\})\s*$", attrs)
    if not found:
        return {}
    try:
        return json.loads(found.group(1))
    except json.JSONDecodeError:
        return {}


def replica_group(instr: Instr) -> tuple[int, int]:
    """(size, stride) of the first replica group (or source-target pair) of a collective."""
    pairs = re.search(r"source_target_pairs=\{\{(\d+),(\d+)\}", instr.attrs)
    if pairs:
        return 2, max(1, abs(int(pairs.group(2)) - int(pairs.group(1))))
    group = first_replica_group(instr.attrs)
    if group is None:
        return 1, 1
    return len(group), (int(group[1] - group[0]) if len(group) > 1 else 1)
