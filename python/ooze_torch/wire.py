"""The trainer worker's wire protocol (native/worker/protocol.ts) on the Python side.

Frames are a 4-byte big-endian body length, then a msgpack body. Typed arrays travel as msgpackr's
"moreTypes" extension: ext type 0x74 ("t"), whose first data byte is the array's kind (msgpackr's
order: Int8, Uint8, Uint8Clamped, Int16, Uint16, Int32, Uint32, Float32, Float64, ...) and the rest
its little-endian elements. They decode to numpy arrays and numpy arrays encode back the same way.
"""
from __future__ import annotations

import struct
from typing import Any, BinaryIO

import msgpack
import numpy as np

TYPED_ARRAY_EXT = 0x74
# msgpackr's typed-array codes, in its order; Uint8Clamped decodes as uint8.
_KINDS = [np.int8, np.uint8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.float32, np.float64, np.int64, np.uint64]
_CODE_OF = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int16): 3, np.dtype(np.uint16): 4, np.dtype(np.int32): 5,
            np.dtype(np.uint32): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8, np.dtype(np.int64): 9, np.dtype(np.uint64): 10}


class MalformedFrame(Exception):
    """A frame that is not valid msgpack or carries an unknown typed-array kind."""


def _ext_hook(code: int, data: bytes) -> Any:
    if code != TYPED_ARRAY_EXT:
        raise MalformedFrame(f"unknown msgpack extension type {code}")
    if len(data) < 1 or data[0] >= len(_KINDS):
        raise MalformedFrame(f"typed array of unknown kind {data[0] if data else None}")
    kind = _KINDS[data[0]]
    # astype copies (arrays over the frame's bytes would be read-only) into the machine's byte order
    return np.frombuffer(data, dtype=np.dtype(kind).newbyteorder("<"), offset=1).astype(kind)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        dt = obj.dtype.newbyteorder("=")
        code = _CODE_OF.get(np.dtype(dt.type))
        if code is None:
            raise TypeError(f"cannot send a numpy array of dtype {obj.dtype}")
        return msgpack.ExtType(TYPED_ARRAY_EXT, bytes([code]) + np.ascontiguousarray(obj, dtype=np.dtype(dt.type).newbyteorder("<")).tobytes())
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    raise TypeError(f"cannot send a {type(obj).__name__}")


def encode_frame(msg: Any) -> bytes:
    body = msgpack.packb(msg, default=_default, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def decode_body(body: bytes) -> Any:
    try:
        return msgpack.unpackb(body, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except MalformedFrame:
        raise
    except Exception as e:  # msgpack's own errors: truncated, bad type byte, ...
        raise MalformedFrame(f"trainer worker frame of {len(body)} bytes is not valid msgpack: {e}") from e


def read_frame(stream: BinaryIO) -> Any | None:
    """The next message, or None when the stream ended (the parent closed stdin)."""
    head = _read_exactly(stream, 4)
    if head is None:
        return None
    if len(head) < 4:
        raise MalformedFrame("stream ended inside a frame header")
    (n,) = struct.unpack(">I", head)
    body = _read_exactly(stream, n)
    if body is None or len(body) < n:
        raise MalformedFrame(f"stream ended inside a frame of {n} bytes")
    return decode_body(body)


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        c = stream.read(n - got)
        if not c:
            return None if got == 0 and n > 0 else b"".join(chunks)
        chunks.append(c)
        got += len(c)
    return b"".join(chunks)
