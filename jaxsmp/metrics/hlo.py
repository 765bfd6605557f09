"""Reading compiled HLO text (``compiled.as_text()``): its computations and array bytes.

Shared by the structure tests (``tests/jaxsmp/hlo.py``) and the benchmarks' collective
counts (``bench/train_throughput.py --hlo``).
"""
from __future__ import annotations

import math
import re

import numpy as np

HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
ARRAY = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|f8e4m3fn|f8e5m2|f16|bf16|f32|f64)"
                   r"\[([\d,]*)\]")
# an attribute naming called computations: a braced list, or one name (XLA prints
# ``calls=%f, metadata=...`` on an async fusion-start: the list must not run on)
_NAMES = r"=(?:\{([%\w.\-, ]+)\}|(%?[\w.\-]+))"
_CALLED = re.compile(r"(?:body|condition|calls|to_apply|branch_computations|"
                     r"called_computations|async_execution_thread)" + _NAMES)
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
    pattern = _CALLED if key is None else re.compile(key + _NAMES)
    return [c.strip().lstrip("%") for braced, one in pattern.findall(line)
            for c in (braced or one).split(",")]


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


def _iota(dims: str, transpose: str | None) -> np.ndarray:
    """XLA's iota device list ``[dims]T(perm)``, flat."""
    ids = np.arange(math.prod(int(x) for x in dims.split(","))).reshape(
        [int(x) for x in dims.split(",")])
    return (ids.transpose([int(x) for x in transpose.split(",")]) if transpose else ids).ravel()


def _device_ids(text: str | None, count: int) -> np.ndarray:
    """A mesh's ``device_ids=(...)``: listed, or iota ``[4,2]T(1,0)``; none: in order."""
    if not text:
        return np.arange(count)
    iota = re.fullmatch(r"\s*\[([\d,]+)\](?:<=\[([\d,]+)\])?(?:T\(([\d,]+)\))?\s*", text)
    if iota:
        return _iota(iota.group(2) or iota.group(1), iota.group(3))
    return np.asarray([int(x) for x in re.findall(r"\d+", text)])


def _mesh_group(axes_text: str, device_ids: str | None, grouped: str | None
                ) -> list[int]:
    """The first replica group of GSPMD's mesh-axes format: the devices varying over the
    ``grouped`` axes (None: all), in the order listed (a sub-axis ``name:(pre)size`` splits its axis
    into ``pre x size x rest``), the other axes at 0."""
    names, sizes = zip(*((n.strip().strip("'\""), int(v)) for n, v in
                         (a.split("=") for a in axes_text.split(","))))
    refs = [re.fullmatch(r"([^:]+)(?::\((\d+)\)(\d+))?", r.replace("'", "").strip())
            for r in (",".join(names) if grouped is None else grouped).split(",") if r.strip()]
    subs = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in refs if m.group(2)}
    dims, where = [], {}
    for name, size in zip(names, sizes):
        pre, sub = subs.get(name, (1, size))
        where[name] = len(dims) + 1
        dims += [pre, sub, size // (pre * sub)]
    ids = _device_ids(device_ids, math.prod(sizes)).reshape(dims)
    order = [where[m.group(1)] for m in refs]
    picked = ids[tuple(slice(None) if d in order else 0 for d in range(len(dims)))]
    kept = sorted(order)
    return [int(x) for x in picked.transpose([kept.index(d) for d in order]).reshape(-1)]


def first_replica_group(attrs: str) -> list[int] | None:
    """The devices of a collective's first replica group, in every format XLA prints:
    listed (``{{0,1},{2,3}}``), iota (``[2,4]<=[4,2]T(1,0)``) and GSPMD's mesh axes
    (``mesh['axis_0'=4,'axis_1'=2] {'axis_0'}``, with ``device_ids=(...)`` listed or
    iota, and sub-axes ``'axis_0':(2)2``); None without replica groups."""
    listed = re.search(r"replica_groups=\{\{([\d,]+)\}", attrs)
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?",
                     attrs)
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(((?:[^()]|\([^()]*\))*)\))?"
                     r"(?:\s*\{([^}]*)\})?", attrs)
    if listed:
        return [int(x) for x in listed.group(1).split(",")]
    if iota:
        ids = _iota(iota.group(3), iota.group(4))
        return [int(x) for x in ids.reshape(int(iota.group(1)), int(iota.group(2)))[0]]
    if mesh:
        return _mesh_group(mesh.group(1), mesh.group(2), mesh.group(3))
    return None


def group_size(attrs: str) -> str:
    """The number of devices in each group of a collective, from its HLO attributes
    ("pairs" for a collective-permute, "all" without replica groups)."""
    group = first_replica_group(attrs)
    if group is not None:
        return str(len(group))
    if "source_target_pairs" in attrs:
        return "pairs"
    return "all"
