"""Tables and files: ``<date>-<gpu>.md`` and ``.json`` in ``bench/results`` (and in
``--out``), rewritten after every row so that a run killed part-way leaves what it has."""
from __future__ import annotations

import importlib
import json
import re
import time
from pathlib import Path


def _cell(value, fmt: str) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and fmt:
        return format(value, fmt)
    return str(value).replace("|", "/").replace("\n", " ")


def section_table(name: str, entry: dict) -> str:
    columns = importlib.import_module(f"bench.gpucheck.{name}").COLUMNS
    head = [h for _, h, _ in columns] + ["status / note"]
    lines = [f"### {entry['title']}", "",
             f"budget {entry.get('budget_s', '?')} s, took {entry.get('wall_s', '?')} s", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in entry["rows"]:
        if row.get("facts"):
            lines += [f"| {k} | {_cell(v, '')} | |" for k, v in row["facts"].items()]
            continue
        note = row.get("note", "") if row["status"] == "ok" else (
            f"{row['status']}: {row.get('reason', '')}")
        cells = [_cell(row.get(key), fmt) for key, _, fmt in columns] + [_cell(note, "")]
        lines.append("| " + " | ".join(cells) + " |")
    if entry.get("stopped"):
        lines += ["", f"Stopped: {entry['stopped']}"]
    notes = importlib.import_module(f"bench.gpucheck.{name}").NOTES
    return "\n".join(lines + ["", notes.strip(), ""])


def tables(results: dict) -> str:
    return "\n".join(section_table(name, entry) for name, entry in results.items())


def progress(name: str, row: dict) -> str:
    what = row.get("label", "")
    detail = row.get("reason", "") if row["status"] != "ok" else ""
    return f"[{time.strftime('%H:%M:%S')}] {name}: {what}: {row['status']} {detail}".rstrip()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


class Writer:
    """Writes the results as JSON and Markdown under ``results_dir`` and ``out``."""

    def __init__(self, meta: dict, results: dict, results_dir: Path, out: Path | None,
                 smoke: bool):
        self.meta, self.results, self.smoke = meta, results, smoke
        self.dirs = [results_dir] + ([out] if out else [])
        self.date = time.strftime("%Y-%m-%d")

    def stem(self) -> str:
        env = self.results.get("environment", {}).get("rows", [{}])[0].get("facts") or {}
        device = "cpu-smoke" if self.smoke else slug(env.get("device_kind", "unknown"))
        return f"{self.date}-{device}"

    def paths(self) -> list[Path]:
        return [d / f"{self.stem()}.{ext}" for d in self.dirs for ext in ("md", "json")]

    def save(self) -> None:
        text = json.dumps({"meta": self.meta, "sections": self.results}, indent=1,
                          default=str)
        md = (f"# jaxsmp GPU check, {self.meta['started']}\n\n`{self.meta['command']}`"
              f"{' (smoke: CPU, tiny shapes)' if self.smoke else ''}\n\n"
              + tables(self.results))
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{self.stem()}.json").write_text(text)
            (d / f"{self.stem()}.md").write_text(md)
