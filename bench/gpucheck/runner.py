"""The one command: sections in order, each under its share of the time budget, rows in
worker processes (``worker.py``), results written after every row (``report.py``)."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.gpucheck import report
from bench.gpucheck.common import first_line
from bench.gpucheck.worker import PREFIX

ROOT = Path(__file__).resolve().parents[2]
# (section, share of the budget); a section's budget is its share of what is left, so
# time an earlier section did not use goes to the later ones
SECTIONS = (("environment", 0), ("training", 48), ("attention", 17), ("fp8", 14),
            ("gemms", 6), ("remat", 17), ("kernels", 12), ("planner", 4))
ENVIRONMENT_S = 45       # the environment's budget, out of the total: the rest need it
FLOOR_S = {"planner": 20}  # a worker's start at least, though earlier sections overran
DEFAULT_BUDGET_S = 440   # 8 minutes less 40 s for start-up, writing and margin


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/gpu_check.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="every section on CPU at tiny shapes (CI: under 2 minutes)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for all sections (default {DEFAULT_BUDGET_S}; "
                             f"--smoke: 100)")
    parser.add_argument("--sections", nargs="+", choices=[s for s, _ in SECTIONS],
                        default=[s for s, _ in SECTIONS],
                        help="run only these (environment always runs)")
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                        help="run only the rows whose label holds one of the TEXTs "
                             "(e.g. 'llama')")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the results (and the workers' log) here")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.budget is None:
        args.budget = 100.0 if args.smoke else float(DEFAULT_BUDGET_S)
    return args


def worker_env(base: dict, smoke: bool, cache_dir: str) -> dict:
    env = {**base, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [base.get("PYTHONPATH")])])}
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
    else:  # the planner's memory model assumes most of the GPU; JAX's default is 0.75
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.90")
    # a program compiled again (the fp8 count, the same step in two sections) is loaded
    env.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return env


class Worker:
    """One worker process and the events its stdout brings (a thread reads them)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.events = proc, queue.Queue()
        threading.Thread(target=_lines, args=(proc, self.events), daemon=True).start()


class Workers:
    """Starts workers. On a GPU host each row group gets a fresh process (its own peak
    memory) and one spare waits, already importing, for the next group with the default
    environment. With ``reuse`` (``--smoke``: a small CPU, where imports cost more than
    the rows) one worker serves every group with the default environment in turn."""

    def __init__(self, env: dict, log, spare: bool, reuse: bool = False):
        self.env, self.log, self.keep_spare, self.reuse = env, log, spare, reuse
        self.spare: Worker | None = None

    def _spawn(self, extra: dict) -> Worker:
        return Worker(subprocess.Popen(
            [sys.executable, "-m", "bench.gpucheck.worker"], cwd=ROOT,
            env={**self.env, **extra}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, start_new_session=True))

    def take(self, extra: dict) -> Worker:
        if extra or self.spare is None or self.spare.proc.poll() is not None:
            worker = self._spawn(extra)
        else:
            worker, self.spare = self.spare, None
        if not extra and self.keep_spare and not self.reuse:
            self.spare = self._spawn({})
        return worker

    def give_back(self, worker: Worker, extra: dict) -> None:
        """After a group that ended well: kept for the next one (``reuse``), or its
        input closed so that it exits."""
        if self.reuse and not extra and worker.proc.poll() is None:
            self.spare = worker
        else:
            worker.proc.stdin.close()
            worker.proc.wait()

    def close(self) -> None:
        if self.spare is not None:
            kill(self.spare.proc)


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _lines(proc: subprocess.Popen, out: queue.Queue) -> None:
    for line in proc.stdout:
        if line.startswith(PREFIX):
            out.put(json.loads(line[len(PREFIX):]))
    out.put(None)


def run_group(workers: Workers, section: str, rows: list[dict], ctx: dict, deadline: float,
              extra: dict, record) -> None:
    """Runs ``rows`` in one worker; ``record(i, result)`` as each comes in. Rows left
    when the worker ends or the deadline passes are recorded as skipped or killed."""
    worker = workers.take(extra)
    try:
        worker.proc.stdin.write(json.dumps({"section": section, "rows": rows,
                                            "deadline": deadline, "ctx": ctx}) + "\n")
        worker.proc.stdin.flush()
    except BrokenPipeError:  # it died importing: its exit code is recorded below
        pass
    done, running = set(), None
    while True:
        try:
            event = worker.events.get(timeout=max(0.1, deadline - time.time()))
        except queue.Empty:
            event = "deadline"
        if event is None or event == "deadline" or event["event"] == "done":
            break
        if event["event"] == "start":
            running = event["index"]
        else:
            done.add(event["index"])
            record(event["index"], event["result"])
    if event == "deadline":
        kill(worker.proc)
    elif event is not None:
        workers.give_back(worker, extra)
    code = worker.proc.wait() if worker.proc.poll() is not None or event is None else None
    for i in range(len(rows)):
        if i in done:
            continue
        if i == running:
            why = ("killed: the section's time budget ran out during this row"
                   if event == "deadline" else f"the worker died during this row (exit {code})")
            record(i, {"status": "error", "reason": why})
        else:
            record(i, {"status": "skipped", "reason": "the section's time budget was spent"})


def groups(rows: list[dict], isolate: bool) -> list[list[int]]:
    """Row indices per worker: one row each when ``isolate``, else runs of rows with the
    same environment."""
    out: list[list[int]] = []
    for i, row in enumerate(rows):
        if out and not isolate and rows[out[-1][0]].get("env", {}) == row.get("env", {}):
            out[-1].append(i)
        else:
            out.append([i])
    return out


def chosen(section: str, rows: list[dict], only: list[str] | None) -> list[dict]:
    """The rows ``--only`` keeps: those whose label holds one of its texts (the
    environment's all)."""
    return rows if section == "environment" or only is None else [
        r for r in rows if any(text in r["label"] for text in only)]


def run_section(name: str, module, results: dict, ctx: dict, workers: Workers,
                deadline: float, save) -> None:
    try:
        rows = chosen(name, module.rows(ctx, results), ctx.get("only"))
    except Exception as error:  # recorded; the next section runs
        results[name] = {"title": module.TITLE, "rows": [], "stopped":
                         f"its rows could not be set up: {first_line(error)}"}
        save()
        return
    entry = results[name] = {"title": module.TITLE, "budget_s": round(deadline - time.time()),
                             "rows": [dict(r, status="pending") for r in rows]}
    start = time.time()
    isolate = bool(getattr(module, "ISOLATE", False)) and not ctx["smoke"]

    def record(i: int, result: dict) -> None:
        entry["rows"][i] = {**rows[i], **result}
        print(report.progress(name, entry["rows"][i]), file=sys.stderr, flush=True)
        save()
    for group in groups(rows, isolate):
        if time.time() >= deadline:
            for i in group:
                record(i, {"status": "skipped", "reason": "the section's time budget was spent"})
            continue
        extra = {**getattr(module, "ENV", {}), **rows[group[0]].get("env", {})}
        run_group(workers, name, [rows[i] for i in group], ctx, deadline, extra,
                  lambda j, result, group=group: record(group[j], result))
    entry["wall_s"] = round(time.time() - start, 1)
    save()


def main(argv: list[str] | None = None, base_env: dict | None = None) -> int:
    args = parse(argv)
    base_env = dict(os.environ) if base_env is None else base_env
    os.environ["JAX_PLATFORMS"] = "cpu"  # this process only plans rows; workers use the GPU
    start = time.time()
    end = start + args.budget
    results: dict = {}
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "smoke": args.smoke,
            "budget_s": args.budget, "command": " ".join(sys.argv)}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / "gpu_check.log", "w") if args.out else None
    writer = report.Writer(meta, results, args.results_dir, args.out, args.smoke)
    with tempfile.TemporaryDirectory(prefix="gpucheck-cache-") as cache:
        # a spare worker imports beside the running one: on a GPU host, not on a small CPU
        workers = Workers(worker_env(base_env, args.smoke, cache), log, spare=not args.smoke,
                          reuse=args.smoke)
        try:
            run_all(args, results, workers, writer, end)
        finally:
            workers.close()
    meta["wall_s"] = round(time.time() - start, 1)
    writer.save()
    print(report.tables(results))
    print(f"\nwritten: {', '.join(str(p) for p in writer.paths())}")
    return 0


def run_all(args, results: dict, workers: Workers, writer, end: float) -> None:
    chosen = [(s, w) for s, w in SECTIONS if s == "environment" or s in args.sections]
    ctx: dict = {"smoke": args.smoke, "target_s": 1.0 if args.smoke else 4.0,
                 "only": args.only}
    for k, (name, share) in enumerate(chosen):
        left = sum(w for _, w in chosen[k:])
        deadline = (time.time() + ENVIRONMENT_S if name == "environment" else
                    time.time() + max(FLOOR_S.get(name, 0), (end - time.time()) * share / left))
        module = importlib.import_module(f"bench.gpucheck.{name}")
        run_section(name, module, results, ctx, workers, deadline, writer.save)
        if name == "environment":
            ctx["env"] = next((r["facts"] for r in results[name]["rows"]
                               if r["status"] == "ok"), None)
            stop = ("the environment could not be read" if ctx["env"] is None else
                    None if args.smoke or ctx["env"]["platform"] == "gpu" else
                    f"no GPU found (JAX platform {ctx['env']['platform']!r}); use --smoke")
            if stop:
                results[name]["stopped"] = stop
                print(stop, file=sys.stderr)
                return
