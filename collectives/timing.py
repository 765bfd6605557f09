"""Launching N local JAX processes (calibrate, bench, tests) on free localhost ports."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv_for: Callable[[int, int], Sequence[str]], n: int, timeout: float) -> list[str]:
    """Run ``n`` processes ``python argv_for(process_id, port)`` (a free localhost port) and
    return their stdout. If any fails, or the timeout passes, all are killed and it raises."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    with tempfile.TemporaryDirectory() as tmp:
        logs = [(open(f"{tmp}/{i}.out", "w+"), open(f"{tmp}/{i}.err", "w+")) for i in range(n)]
        procs = [subprocess.Popen([sys.executable, *argv_for(i, port)], env=env, text=True,
                                  stdout=out, stderr=err) for i, (out, err) in enumerate(logs)]
        deadline = time.monotonic() + timeout
        try:
            while any(proc.poll() is None for proc in procs):
                failed = [p for p in procs if p.poll() not in (None, 0)]
                if failed:
                    i = procs.index(failed[0])
                    logs[i][1].seek(0)
                    raise RuntimeError(f"worker {i} exited with {failed[0].returncode}:\n"
                                       f"{logs[i][1].read()[-4000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workers still running after {timeout} s")
                time.sleep(0.05)
            for i, proc in enumerate(procs):
                if proc.returncode:
                    logs[i][1].seek(0)
                    raise RuntimeError(f"worker {i} exited with {proc.returncode}:\n"
                                       f"{logs[i][1].read()[-4000:]}")
            outputs = []
            for out, _ in logs:
                out.seek(0)
                outputs.append(out.read())
            return outputs
        finally:
            for proc in procs:  # never leave a peer waiting on a dead coordinator
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for out, err in logs:
                out.close()
                err.close()
