"""Batches placed on the mesh from only this host's rows, prefetched on a thread."""
import jax
import numpy as np
import pytest

import jaxsmp
from jaxsmp.data import ByteTokenizer, TokenBatches, default_corpus
from jaxsmp.data.loader import Prefetcher, device_batch, local_positions
from jaxsmp.sharding.rules import batch_spec


@pytest.fixture(scope="module")
def source():
    return TokenBatches(ByteTokenizer().encode(default_corpus()[:20_000]), 16, 32, seed=0)


def test_a_host_reads_only_the_rows_of_its_own_devices():
    mesh = jaxsmp.Mesh(dp=2, sdp=2, tp=2)
    indices = mesh.sharding(batch_spec(2)).devices_indices_map((16, 32))
    first_host = {d: i for d, i in indices.items() if d.id < 4}  # as if 2 hosts x 4 devices
    assert local_positions(first_host, 16) == list(range(8))
    assert local_positions(indices, 16) == list(range(16))


def test_the_device_batch_is_the_host_batch_sharded_over_the_data_axes(source):
    mesh = jaxsmp.Mesh(sdp=4, tp=2)
    placed = device_batch(source, 3, mesh)["tokens"]
    assert placed.sharding == mesh.sharding(batch_spec(2))
    np.testing.assert_array_equal(np.asarray(placed), source.batch(3)["tokens"])


def test_prefetched_batches_equal_inline_ones_from_any_start(source):
    mesh = jaxsmp.Mesh(sdp=8)
    with Prefetcher(source, mesh, range(2, 6), depth=2) as ahead:
        got = [(i, np.asarray(b["tokens"])) for i, b in ahead]
    assert [i for i, _ in got] == [2, 3, 4, 5]
    for i, tokens in got:
        np.testing.assert_array_equal(tokens, source.batch(i)["tokens"])


def test_an_error_while_preparing_is_raised_by_the_loop(source):
    class Broken:
        batch_size, seq_len = 8, 32

        def rows(self, index, positions):
            raise OSError(f"disk gone at batch {index}")

    with Prefetcher(Broken(), jaxsmp.Mesh(sdp=8), range(3), depth=2) as ahead:
        with pytest.raises(OSError, match="disk gone at batch 0"):
            next(iter(ahead))


def test_closing_early_stops_the_thread(source):
    ahead = Prefetcher(source, jaxsmp.Mesh(sdp=8), range(1000), depth=2)
    next(iter(ahead))
    ahead.close()
    assert not ahead._thread.is_alive() and len(jax.devices()) == 8
