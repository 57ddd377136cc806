"""A CompressedListStorage state whose rows cannot be read (a damaged layout, a layout that
does not match its bytes) is refused before anything changes; real states all load."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ReplayBuffer, TensorDictReplayBuffer
from tdreplay.storages import CompressedListStorage


def td(n, start=0):
    return TensorDict({"obs": torch.arange(start, start + n).float().unsqueeze(-1),
                       "next": {"done": torch.zeros(n, 1, dtype=torch.bool),
                                "obs": torch.arange(n).float().unsqueeze(-1)}}, [n])


def filled(start=0):
    rb = TensorDictReplayBuffer(storage=CompressedListStorage(10))
    rb.extend(td(7, start))
    rb.sample(2)
    return rb


def listed(rb):
    """``rb.state_dict()`` with its rows as a list of ``CompressedRow`` (the form of states
    saved by 0.6, still loaded), whose rows a test can damage one by one."""
    state = rb.state_dict()
    state["_storage"]["storage"] = list(rb.storage.items())
    del state["_storage"]["blob_crc"]  # (0.6 recorded no CRC of the compressed bytes)
    return state


def with_layout(row, **changes):
    return row._replace(layout=row.layout._replace(**changes))


def leaf(row, i, value):
    leaves = list(row.layout.leaves)
    leaves[i] = value
    return with_layout(row, leaves=tuple(leaves))


DAMAGE = {
    "layout-none": lambda r: r._replace(layout=None),
    "kind": lambda r: with_layout(r, kind="fish"),
    "batch-size-none": lambda r: with_layout(r, batch_size=None),
    "batch-size-negative": lambda r: with_layout(r, batch_size=(-1,)),
    "leaves-none": lambda r: with_layout(r, leaves=None),
    "leaf-dropped": lambda r: with_layout(r, leaves=r.layout.leaves[:-1]),
    "leaf-short": lambda r: leaf(r, 0, r.layout.leaves[0][:2]),
    "leaf-dtype-str": lambda r: leaf(r, 0, (r.layout.leaves[0][0], "float", r.layout.leaves[0][2])),
    "leaf-shape-bigger": lambda r: leaf(r, 0, (*r.layout.leaves[0][:2],
                                               (r.layout.leaves[0][2][0] + 1,))),
    "leaf-shape-float": lambda r: leaf(r, 0, (*r.layout.leaves[0][:2], (1.5,))),
    "leaf-key-none": lambda r: leaf(r, 0, (None, *r.layout.leaves[0][1:])),
    "leaf-keys-clash": lambda r: leaf(r, 0, (("next",), *r.layout.leaves[0][1:])),
    "blob-none": lambda r: r._replace(blob=None),
}


def contents(rb):
    return rb[:].to_dict() if len(rb) else None


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("row", [0, 6])
def test_a_row_that_cannot_be_read_is_refused(damage, row):
    state = listed(filled())
    state["_storage"]["storage"][row] = DAMAGE[damage](state["_storage"]["storage"][row])
    dst = filled(start=50)
    before = (str(contents(dst)), dst.write_count)
    with pytest.raises(ValueError, match=rf"\['storage'\]\[{row}\] cannot be read"):
        dst.load_state_dict(state)
    assert (str(contents(dst)), dst.write_count) == before


def test_the_first_row_of_a_layout_that_does_not_decompress_is_refused():
    state = listed(filled())
    state["_storage"]["storage"][0] = state["_storage"]["storage"][0]._replace(blob=b"not zlib")
    dst = filled(start=50)
    with pytest.raises(ValueError, match=r"\['storage'\]\[0\] cannot be read: it does not "):
        dst.load_state_dict(state)
    assert dst[0]["obs"].tolist() == [50.0]


@pytest.mark.parametrize("seed", range(6))
def test_states_of_random_histories_load_and_read_alike(seed):
    g = torch.Generator().manual_seed(seed)
    tensors = ReplayBuffer(storage=CompressedListStorage(10))
    tds = TensorDictReplayBuffer(storage=CompressedListStorage(10))
    for step in range(int(torch.randint(1, 6, (1,), generator=g))):
        n = int(torch.randint(1, 8, (1,), generator=g))
        width = int(torch.randint(1, 4, (1,), generator=g))  # rows of several layouts
        tensors.extend(torch.randn(n, width, generator=g))
        tds.extend(td(n, 10 * step))
    for rb, make in ((tensors, lambda: ReplayBuffer(storage=CompressedListStorage(10))),
                     (tds, lambda: TensorDictReplayBuffer(storage=CompressedListStorage(10)))):
        twin = make()
        twin.load_state_dict(rb.state_dict())
        for i in range(len(rb)):
            a, b = rb[i], twin[i]
            assert str(a.to_dict() if hasattr(a, "to_dict") else a) == \
                str(b.to_dict() if hasattr(b, "to_dict") else b)


def test_a_damaged_row_after_the_first_of_its_layout_is_named_when_read():
    # loading decompresses one row per layout: the others are read (and found damaged) later
    state = listed(filled())
    row = state["_storage"]["storage"][4]
    blob = bytearray(row.blob)
    blob[len(blob) // 2] ^= 0xFF  # a flipped byte: zlib's checksum refuses the row
    state["_storage"]["storage"][4] = row._replace(blob=bytes(blob))
    rb = filled(start=50)
    rb.load_state_dict(state)
    damaged = r"the compressed row at slot 4 cannot be decompressed \(.*\): its bytes are damaged"
    for read in (lambda: rb[:], lambda: rb[4], lambda: rb.storage.get(torch.tensor([[1, 4]]))):
        with pytest.raises(ValueError, match=damaged):
            read()
    # the other rows read as saved, and sampling them goes on
    assert rb.storage.get(torch.tensor([0, 3, 6]))["obs"][:, 0].tolist() == [0.0, 3.0, 6.0]
    rb.extend(td(3, 100))  # overwrites slots 7, 8, 9 (not the damaged row)
    assert rb.storage.get(torch.tensor([8]))["obs"][:, 0].tolist() == [101.0]


def test_a_damaged_row_in_a_read_of_rows_of_several_layouts_is_named():
    rb = ReplayBuffer(storage=CompressedListStorage(4))
    rb.extend([torch.zeros(2), torch.ones(3), torch.full((2,), 2.0), torch.full((3,), 3.0)])
    state = listed(rb)
    row = state["_storage"]["storage"][3]  # the second row of its layout: not checked at load
    state["_storage"]["storage"][3] = row._replace(blob=row.blob[:-2])  # truncated
    twin = ReplayBuffer(storage=CompressedListStorage(4))
    twin.load_state_dict(state)
    with pytest.raises(ValueError, match=r"compressed row at slot 3 cannot be decompressed"):
        twin[:]  # rows of two layouts: read one by one
    assert [t.tolist() for t in twin[:3]] == [[0.0, 0.0], [1.0, 1.0, 1.0], [2.0, 2.0]]


@pytest.mark.parametrize("codec", ["default", "zlib"])
def test_every_single_byte_change_of_a_row_raises_when_read(codec):
    # a row's checksum (zstd's, zlib's Adler-32): a damaged row never reads as other values
    import zlib

    kwargs = {} if codec == "default" else {  # uint8 tensors in, bytes out
        "compression_fn": lambda t: zlib.compress(t.numpy().tobytes()),
        "decompression_fn": lambda t: zlib.decompress(t.numpy().tobytes())}
    rb = ReplayBuffer(storage=CompressedListStorage(4, **kwargs))
    rb.extend(torch.arange(256, dtype=torch.uint8).reshape(4, 64))
    state = listed(rb)
    row = state["_storage"]["storage"][2]  # not the first of its layout: loads unchecked
    twin = ReplayBuffer(storage=CompressedListStorage(4, **kwargs))
    for i in range(len(row.blob)):
        blob = bytearray(row.blob)
        blob[i] ^= 0xFF
        state["_storage"]["storage"][2] = row._replace(blob=bytes(blob))
        twin.load_state_dict(state)
        with pytest.raises(ValueError, match="compressed row at slot 2 cannot be decompressed"):
            twin[2]


def test_a_state_dict_loads_with_torch_load_weights_only(tmp_path):
    """``torch.save(rb.state_dict())`` then ``torch.load`` (``weights_only=True``, torch's
    default) failed on the ``CompressedRow`` class; the rows are saved as tensors and plain
    values now, and read back alike."""
    rb = filled()
    torch.save(rb.state_dict(), tmp_path / "state.pt")
    twin = filled(start=50)
    twin.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert str(contents(twin)) == str(contents(rb)) and twin.write_count == rb.write_count


@pytest.mark.parametrize(("damage", "match"), [
    (lambda r: r.update(offsets=r["offsets"][:-1]), "offsets do not match its bytes"),
    (lambda r: r.update(blobs=r["blobs"][:-1]), "offsets do not match its bytes"),
    (lambda r: r.update(row_layouts=r["row_layouts"] + 5), "structures that are not in"),
    (lambda r: r.update(layouts=[{"kind": "tensor"}]), "rows record is damaged"),
    (lambda r: r.pop("blobs"), "rows record is damaged"),
])
def test_a_damaged_rows_record_is_refused_before_anything_changes(damage, match):
    state = filled().state_dict()
    damage(state["_storage"]["storage"])
    dst = filled(start=50)
    before = (str(contents(dst)), dst.write_count)
    with pytest.raises(ValueError, match=match):
        dst.load_state_dict(state)
    assert (str(contents(dst)), dst.write_count) == before


@pytest.mark.parametrize("at", [0.1, 0.5, 0.9])
def test_a_damaged_byte_of_a_saved_row_is_refused_before_anything_changes(at):
    # one byte flipped in the rows' record: the state loaded (its first row per layout read
    # fine), the old rows were gone, and reading the damaged row raised later
    state = filled().state_dict()
    blobs = state["_storage"]["storage"]["blobs"]
    blobs[int(blobs.numel() * at)] ^= 0x5A
    dst = filled(start=50)
    before = (str(contents(dst)), dst.write_count)
    with pytest.raises(ValueError, match=r"row \d+: its compressed bytes are damaged"):
        dst.load_state_dict(state)
    assert (str(contents(dst)), dst.write_count) == before
