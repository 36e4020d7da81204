"""Hand framing of the two messages that carry payloads, so a payload is copied once:
from the received message straight into the caller's buffer (Fetch), or from the
caller's buffer into the outgoing message (Store). The encoding is protobuf's; the
generated classes frame everything else.
"""
from .errors import DataLossError
from .v1 import kvcache_pb2 as pb


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(view, pos):
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
    raise DataLossError("FetchResponse: a malformed varint")


def split_fetch_response(raw):
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
            raise DataLossError("FetchResponse: a field runs past the message")
        fields[tag >> 3] = view[pos:pos + length]
        pos += length
    return fields.get(1, view[0:0]), fields.get(2, view[0:0])


_PAYLOAD_TAG = _varint((4 << 3) | 2)  # StoreRequest.payload, length-delimited


def store_request(namespace_id, parent_key, tokens, payload, durability, ttl_s):
    """A serialized StoreRequest; `payload` (any buffer) is copied once, here."""
    head = pb.StoreRequest(namespace_id=namespace_id, parent_key=parent_key,
                           tokens=tokens.tolist(), durability=durability,
                           ttl_seconds=ttl_s).SerializeToString()
    return b"".join((head, _PAYLOAD_TAG, _varint(len(payload)), payload))
