"""The bytes kvcached and its clients frame by hand — the Python side of the C++ module
wire/ (wire/wire.h), held to the same vectors (tests/wire/wire_vectors.json, written by
protobuf's own encoder): a chunk key on the wire, keys packed end to end
(LookupRequest.packed_chunk_keys), the FetchResponse frame, and the StoreRequest whose
payload is appended without a second copy. The generated classes frame everything else.
"""
from typing import Any, List, Sequence, Tuple, Union

from .errors import DataLossError, InvalidArgumentError
from .v1 import kvcache_pb2 as pb

KEY_BYTES = 16
BytesLike = Union[bytes, bytearray, memoryview]


def key_bytes(k: object, what: str) -> bytes:
    """A 16-byte key from bytes-like `k`; InvalidArgumentError naming `what` otherwise (a
    str or an int is refused: bytes(5) would be five zero bytes, not a key)."""
    if isinstance(k, (str, int, float)) or k is None:
        raise InvalidArgumentError(f"{what} is a {type(k).__name__}; keys are 16 bytes")
    try:
        b: bytes = bytes(k)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidArgumentError(
            f"{what} ({type(k).__name__}) is not bytes-like; keys are 16 bytes") from None
    if len(b) != KEY_BYTES:
        raise InvalidArgumentError(f"{what} is {len(b)} bytes; keys are 16 bytes")
    return b


def pack_keys(keys: Sequence[bytes]) -> bytes:
    """Keys end to end, 16 bytes each (checked by the caller: key_bytes)."""
    return b"".join(keys)


def unpack_keys(packed: BytesLike) -> List[bytes]:
    """The keys of a packed field; InvalidArgumentError when it is not whole keys."""
    packed = bytes(packed)
    if len(packed) % KEY_BYTES:
        raise InvalidArgumentError(
            f"packed_chunk_keys is {len(packed)} bytes, not a whole number of 16-byte keys")
    return [packed[i:i + KEY_BYTES] for i in range(0, len(packed), KEY_BYTES)]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(view: memoryview, pos: int) -> Tuple[int, int]:
    start = pos
    shift = result = 0
    while pos < len(view):
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise DataLossError(f"FetchResponse: a malformed varint at byte {start} of {len(view)}")


def fetch_response_header(key: bytes, payload_bytes: int) -> bytes:
    """FetchResponse{chunk_key = key, payload = <payload_bytes bytes>} up to the payload
    (the daemon's framing; what wire::FetchResponseHeader writes)."""
    return b"\x0a\x10" + key + b"\x12" + _varint(payload_bytes)


def split_fetch_response(raw: BytesLike) -> Tuple[memoryview, memoryview]:
    """(chunk_key, payload) of a serialized FetchResponse, as memoryviews into `raw`."""
    view = memoryview(raw)
    # kvcached's own framing: key field (16 bytes), then the payload field.
    if len(view) > 19 and view[0] == 0x0A and view[1] == 16 and view[18] == 0x12:
        length, pos = _read_varint(view, 19)
        if pos + length == len(view):
            return view[2:18], view[pos:]
    fields = {}
    pos = 0
    while pos < len(view):
        tag, pos = _read_varint(view, pos)
        if tag & 7 != 2:
            raise DataLossError(f"FetchResponse: field {tag >> 3} has wire type {tag & 7}")
        length, pos = _read_varint(view, pos)
        if pos + length > len(view):
            raise DataLossError(f"FetchResponse: field {tag >> 3} ({length} bytes at byte {pos}) "
                                f"runs past the message ({len(view)} bytes)")
        fields[tag >> 3] = view[pos:pos + length]
        pos += length
    return fields.get(1, view[0:0]), fields.get(2, view[0:0])


_PAYLOAD_TAG = _varint((4 << 3) | 2)  # StoreRequest.payload, length-delimited


_CHUNK_KEY_TAG = _varint((7 << 3) | 2)  # StoreRequest.chunk_key


def store_request(namespace_id: int, parent_key: bytes, tokens: Any, payload: Any,
                  durability: Any, ttl_s: int, chunk_key: bytes = b"") -> bytes:
    """A serialized StoreRequest, fields in number order as protobuf writes them (the
    payload, field 4, between tokens and durability; chunk_key, field 7, last); `payload`
    (any buffer, or a list of buffers: the parts of one page, in order) is copied once,
    here. tokens None: none (a caller-keyed namespace)."""
    head = pb.StoreRequest(namespace_id=namespace_id, parent_key=parent_key,
                           tokens=[] if tokens is None else tokens.tolist()).SerializeToString()
    tail = pb.StoreRequest(durability=durability, ttl_seconds=ttl_s).SerializeToString()
    parts = payload if isinstance(payload, list) else [payload]
    size = sum(memoryview(p).nbytes for p in parts)
    key = (_CHUNK_KEY_TAG + _varint(len(chunk_key)) + chunk_key) if chunk_key else b""
    return b"".join((head, _PAYLOAD_TAG, _varint(size), *parts, tail, key))
