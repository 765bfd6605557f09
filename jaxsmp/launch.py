"""Start a script as several JAX processes on this machine, as on a cluster.

    python -m jaxsmp.launch --hosts 2 --devices-per-host 4 script.py [args...]

Each process gets ``devices-per-host`` simulated CPU devices and the
``JAXSMP_*`` variables :func:`jaxsmp.distributed.initialize` reads. Output lines
are prefixed with the process id. If any process fails, the others are stopped
and the launcher exits with that process's code; ``--timeout`` bounds the run.
SIGTERM or SIGINT to the launcher is passed on to every process as SIGTERM (a
preemption notice: the trainer saves and exits with code 75), and processes that
exit with code 75 are left to stop on their own.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from jaxsmp.cli.preemption import PREEMPTED_EXIT_CODE
from jaxsmp.simulated_devices import set_pool_size


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(process_id: int, hosts: int, devices: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(JAXSMP_COORDINATOR=f"127.0.0.1:{port}", JAXSMP_NUM_PROCESSES=str(hosts),
               JAXSMP_PROCESS_ID=str(process_id), JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{env.get('XLA_FLAGS', '')} "
                         f"--xla_force_host_platform_device_count={devices}".strip())
    set_pool_size(devices, env)
    return env


def _relay(process_id: int, stream, sink) -> None:
    for line in stream:
        sink.write(f"[{process_id}] {line}")
        sink.flush()


def _forward_stop_signals(procs: list[subprocess.Popen]) -> None:
    """SIGTERM/SIGINT to the launcher -> SIGTERM to every process still running."""
    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)


def _wait(procs: list[subprocess.Popen], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0, PREEMPTED_EXIT_CODE)]
        if failed:
            i, code = failed[0]
            print(f"jaxsmp.launch: process {i} exited with code {code}; stopping the others",
                  file=sys.stderr)
            return code
        if None not in codes:  # all done: cleanly, or saved and stopped on a signal
            return PREEMPTED_EXIT_CODE if PREEMPTED_EXIT_CODE in codes else 0
        if time.monotonic() > deadline:
            print(f"jaxsmp.launch: processes still running after {timeout:.0f} s; stopping them",
                  file=sys.stderr)
            return 124
        time.sleep(0.05)


def launch(command: list[str], hosts: int, devices_per_host: int, timeout: float) -> int:
    """Runs ``python command...`` as ``hosts`` processes; returns the exit code."""
    if hosts < 1 or devices_per_host < 1:
        raise ValueError(f"--hosts ({hosts}) and --devices-per-host ({devices_per_host}) "
                         "must be positive")
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, *command], env=_env(i, hosts, devices_per_host, port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(hosts)]
    relays = [threading.Thread(target=_relay, args=(i, p.stdout, sys.stdout), daemon=True)
              for i, p in enumerate(procs)]
    for t in relays:
        t.start()
    _forward_stop_signals(procs)
    try:
        return _wait(procs, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for t in relays:
            t.join(timeout=5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--devices-per-host", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args...]")
    args = parser.parse_args(argv)
    if not args.command:
        parser.error("give the script to run")
    sys.exit(launch(args.command, args.hosts, args.devices_per_host, args.timeout))


if __name__ == "__main__":
    main()
