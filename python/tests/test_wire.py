"""kvcache._wire against tests/wire/wire_vectors.json: the bytes protobuf's own encoder
writes, which the C++ module wire/ is held to as well (tests/wire/wire_test.cc)."""
import json
import os

import pytest

from kvcache import _wire
from kvcache.errors import DataLossError, InvalidArgumentError

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "wire",
                       "wire_vectors.json")


@pytest.fixture(scope="module")
def vectors():
    with open(VECTORS) as f:
        return json.load(f)


def test_keys_and_packed_keys_are_the_vectors_bytes(vectors):
    keys = [_wire.key_bytes(bytes.fromhex(k), f"keys[{i}]") for i, k in enumerate(vectors["keys"])]
    assert _wire.pack_keys(keys).hex() == vectors["packed"]
    assert _wire.unpack_keys(bytes.fromhex(vectors["packed"])) == keys


def test_the_fetch_frame_is_protobufs_encoding(vectors):
    for f in vectors["fetch"]:
        key, n = bytes.fromhex(f["key"]), f["payload_bytes"]
        header = _wire.fetch_response_header(key, n)
        assert header.hex() == f["header"], n
        message = header + bytes([0x5A]) * n
        got_key, payload = _wire.split_fetch_response(message)
        assert bytes(got_key) == key and len(payload) == n
    for f in vectors["fetch_other_encodings"]:
        got_key, payload = _wire.split_fetch_response(bytes.fromhex(f["message"]))
        assert bytes(got_key).hex() == f["key"] and bytes(payload).hex() == f["payload"]


def test_a_store_request_is_protobufs_encoding(vectors):
    import numpy as np
    for s in vectors["store"]:
        got = _wire.store_request(s["namespace_id"], bytes.fromhex(s["parent_key"]),
                                  np.array(s["tokens"], dtype=np.uint32),
                                  bytes.fromhex(s["payload"]), s["durability"], s["ttl_seconds"])
        assert got.hex() == s["message"]


def test_bad_bytes_are_refused_with_what_was_wrong():
    with pytest.raises(InvalidArgumentError, match="parent is 15 bytes; keys are 16 bytes"):
        _wire.key_bytes(b"x" * 15, "parent")
    with pytest.raises(InvalidArgumentError, match="33 bytes, not a whole number"):
        _wire.unpack_keys(b"x" * 33)
    with pytest.raises(DataLossError, match=r"field 2 \(100 bytes at byte 20\) runs past the "
                       r"message \(119 bytes\)"):
        _wire.split_fetch_response(_wire.fetch_response_header(bytes(16), 100) + b"y" * 99)
    with pytest.raises(DataLossError, match="field 1 has wire type 0"):
        _wire.split_fetch_response(b"\x08\x01")
