"""A worker process: ``python -m bench.gpucheck.worker`` imports JAX and jaxsmp (without
starting a backend, so a spare worker can wait beside a running one), then reads jobs
from stdin, one a line, ``{"section", "rows", "deadline", "ctx"}``, until it closes; runs
each job's rows in order with the section's ``run(row, ctx, deadline)``, prints each
result as one line ``GPUCHECK {json}`` as soon as it has it, and a ``done`` event after
the job. An exception ends its row, not the worker."""
from __future__ import annotations

import importlib
import json
import sys
import time
import traceback

PREFIX = "GPUCHECK "


def emit(event: str, index: int, result: dict | None = None) -> None:
    sys.stdout.write(PREFIX + json.dumps({"event": event, "index": index, "result": result})
                     + "\n")
    sys.stdout.flush()


def run_job(job: dict) -> None:
    from bench.gpucheck.common import Skip, first_line
    section = importlib.import_module(f"bench.gpucheck.{job['section']}")
    for index, row in enumerate(job["rows"]):
        if time.time() > job["deadline"]:
            return  # the runner records what is left as skipped
        emit("start", index)
        start = time.perf_counter()
        try:
            result = {"status": "ok", **section.run(row, job["ctx"], job["deadline"])}
        except Skip as skip:
            result = {"status": "skipped", "reason": str(skip)}
        except Exception as error:  # recorded in the results; the next row runs
            traceback.print_exc()
            result = {"status": "error", "reason": first_line(error)}
        result["row_s"] = round(time.perf_counter() - start, 2)
        emit("row", index, result)


def main() -> None:
    import jax  # noqa: F401  (imported before the job arrives; no backend starts)

    import jaxsmp  # noqa: F401
    for line in sys.stdin:
        if line.strip():
            run_job(json.loads(line))
            emit("done", -1)


if __name__ == "__main__":
    main()
