"""Memory-mapped shards served as packed batches, shuffled by (seed, epoch): each
row once per epoch, batch i a function of (seed, i) alone."""
import numpy as np
import pytest

from jaxsmp.data import PackedBatches, TokenDataset


@pytest.fixture(scope="module")
def dataset(prepared_dir):
    return TokenDataset(prepared_dir)


def _stream(dataset):
    return np.concatenate([np.asarray(s) for s in dataset.shards]).astype(np.int32)


def test_reads_across_shard_boundaries(dataset):
    stream = _stream(dataset)
    np.testing.assert_array_equal(dataset.read(49_990, 30), stream[49_990:50_020])
    np.testing.assert_array_equal(dataset.read(0, 5), stream[:5])


def test_each_epoch_visits_every_row_once_in_a_seeded_order(dataset):
    data = PackedBatches(dataset, "train", batch_size=16, seq_len=64, seed=3)
    rows = data.rows_per_epoch
    epoch = np.concatenate([data.row_ids(i, range(16)) for i in range(-(-rows // 16))])
    assert sorted(epoch[:rows]) == list(range(rows))
    assert not np.array_equal(epoch[:rows], np.arange(rows))  # shuffled
    second = PackedBatches(dataset, "train", 16, 64, seed=3).row_ids(rows // 16 + 5, range(16))
    other_seed = PackedBatches(dataset, "train", 16, 64, seed=4).row_ids(5, range(16))
    assert not np.array_equal(other_seed, data.row_ids(5, range(16)))
    assert second.max() < rows  # later epochs wrap around the split


def test_rows_are_packed_windows_of_the_split(dataset):
    data = PackedBatches(dataset, "val", batch_size=4, seq_len=32, seed=0)
    start, _ = dataset.split("val")
    stream = _stream(dataset)
    batch = data.batch(7)["tokens"]
    for row, r in zip(batch, data.row_ids(7, range(4))):
        np.testing.assert_array_equal(row, stream[start + r * 32:start + (r + 1) * 32])
    np.testing.assert_array_equal(data.rows(7, [1, 3]), batch[[1, 3]])


def test_a_split_shorter_than_one_row_is_an_error(dataset):
    with pytest.raises(ValueError, match="fewer than seq_len=100000"):
        PackedBatches(dataset, "val", 4, 100_000)
    with pytest.raises(ValueError, match="not a prepared dataset"):
        TokenDataset(dataset.directory.parent)
