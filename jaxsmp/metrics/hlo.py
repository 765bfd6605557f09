"""Reading compiled HLO text (``compiled.as_text()``): its computations and array bytes.

Shared by the structure tests (``tests/jaxsmp/hlo.py``) and the benchmarks' collective
counts (``bench/train_throughput.py --hlo``).
"""
from __future__ import annotations

import math
import re

HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
ARRAY = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f8e4m3fn|f8e5m2|f16|bf16|f32|f64)"
                   r"\[([\d,]*)\]")
_CALLED = re.compile(r"(?:body|condition|calls|to_apply|branch_computations|"
                     r"called_computations|async_execution_thread)=\{?([%\w.\-, ]+)\}?")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
          "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def computations(text: str) -> tuple[dict[str, list[str]], str]:
    """({computation name: instruction lines}, entry computation name)."""
    comps: dict[str, list[str]] = {}
    entry, current = "", None
    for line in text.splitlines():
        header = HEADER.match(line)
        if header and not line.startswith(" "):
            current = header.group(2)
            comps[current] = []
            entry = current if header.group(1) else entry
        elif current is not None and line.startswith(" "):
            comps[current].append(line.strip())
    return comps, entry


def callees(line: str, key: str | None = None) -> list[str]:
    """The computations an instruction calls (loop bodies and conditions, fusions,
    reductions' ``to_apply``, conditionals' branches); with ``key`` only those of that
    attribute (e.g. ``body``)."""
    pattern = _CALLED if key is None else re.compile(key + r"=\{?([%\w.\-, ]+)\}?")
    return [c.strip().lstrip("%") for group in pattern.findall(line) for c in group.split(",")]


def reachable(comps: dict[str, list[str]], root: str) -> set[str]:
    """The computations ``root`` calls, directly or not, ``root`` included."""
    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        todo += [c for line in comps[name] for c in callees(line)]
    return seen


def shape_bytes(type_text: str) -> int:
    """Bytes of every array in an HLO type (a shape or a tuple of shapes)."""
    return sum(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in ARRAY.findall(type_text))


def group_size(attrs: str) -> str:
    """The number of devices in each group of a collective, from its HLO attributes
    ("pairs" for a collective-permute, "all" without replica groups)."""
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)   # iota form [groups,size]
    if m:
        return m.group(2)
    # mesh form: replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}: over the named axes
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\([^)]*\))?( \{[^}]*\})?",
                  attrs)
    if m:
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(1)))
        names = re.findall(r"'(\w+)'", m.group(2)) if m.group(2) else list(sizes)
        return str(math.prod(int(sizes[a]) for a in names))
    m = re.search(r"replica_groups=\{\{([\d,]*)\}", attrs)
    if m:
        return str(len(m.group(1).split(",")))
    if "source_target_pairs" in attrs:
        return "pairs"
    return "all"
