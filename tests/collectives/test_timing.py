import time

import pytest

from collectives.timing import launch


def test_launch_collects_outputs_in_process_order():
    outs = launch(lambda i, port: ["-c", f"print({i}, {port} > 0)"], 3, timeout=60)
    assert [o.split() for o in outs] == [["0", "True"], ["1", "True"], ["2", "True"]]


def test_launch_fails_fast_and_kills_peers():
    start = time.monotonic()
    script = "import sys, time; sys.exit(3) if {i} == 0 else time.sleep(60)"
    with pytest.raises(RuntimeError, match="exited with 3"):
        launch(lambda i, port: ["-c", script.format(i=i)], 2, timeout=60)
    assert time.monotonic() - start < 30


def test_launch_times_out():
    with pytest.raises(TimeoutError):
        launch(lambda i, port: ["-c", "import time; time.sleep(60)"], 2, timeout=2)


def test_launch_fails_fast_when_a_later_worker_dies():
    start = time.monotonic()
    script = "import sys, time; sys.exit(4) if {i} == 1 else time.sleep(60)"
    with pytest.raises(RuntimeError, match="worker 1 exited with 4"):
        launch(lambda i, port: ["-c", script.format(i=i)], 2, timeout=60)
    assert time.monotonic() - start < 30
