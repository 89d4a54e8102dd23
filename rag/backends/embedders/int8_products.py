"""Exact int8 products on every x86 CPU for an ONNX model whose weight matrices are int8
(`MatMulInteger`, as minilm-l6-ml-v1's export).

ONNX Runtime multiplies uint8 activations by int8 weights with VNNI or AMX where the CPU has them
(exact), else with AVX2's `vpmaddubsw`, which saturates pairs of products at 16 bits: on an
AVX2-only CPU minilm-l6-ml-v1's vectors came out at cosine 0.98-0.99 to the exact ones, so a store
built on one CPU ranked near-ties differently on another. Weights stored as uint8 (the int8 value +
128, zero point + 128: the same integers) take the uint8 x uint8 kernels, which widen to 16 bits
first and are exact everywhere, embedding 1.14x slower on that CPU. `exact_products` reads the CPU;
`unsigned_weights` rewrites the model's bytes in place (no field changes length).
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# CPU flags under which ONNX Runtime's uint8 x int8 products are exact (its VNNI and AMX kernels).
EXACT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")

# ONNX protobuf field numbers (onnx.proto): ModelProto.graph; GraphProto.node, .initializer;
# NodeProto.input, .op_type; TensorProto.data_type, .name, .raw_data; the INT8 and UINT8 types.
_MODEL_GRAPH, _GRAPH_NODE, _GRAPH_INITIALIZER = 7, 1, 5
_NODE_INPUT, _NODE_OP_TYPE = 1, 4
_TENSOR_DATA_TYPE, _TENSOR_INT32_DATA, _TENSOR_NAME, _TENSOR_RAW_DATA = 2, 5, 8, 9
_INT32_DATA_KEY, _RAW_DATA_KEY = (5 << 3) | 2, (9 << 3) | 2  # as packed, length-delimited fields
_INT8, _UINT8 = 3, 2


@functools.cache
def exact_products() -> bool:
    """Whether this CPU's uint8 x int8 products in ONNX Runtime are exact: not an x86 CPU, or one
    with VNNI or AMX."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace").split()
    except OSError:
        return False  # an x86 CPU we cannot read: uint8 weights, exact on any
    return any(f in flags for f in EXACT_FLAGS)


def model_for_this_cpu(model: Path | str) -> Path | str | bytes:
    """`model`, or its bytes with uint8 weights when this CPU's int8 products would saturate (and
    the model has int8 weights to rewrite)."""
    if exact_products():
        return model
    data = bytearray(Path(model).read_bytes())
    try:
        changed = unsigned_weights(data)
    except (ValueError, IndexError):  # not an ONNX model as far as it reads: ONNX Runtime says why
        return model
    return bytes(data) if changed else model


def unsigned_weights(model: bytearray) -> int:
    """Rewrite, in place, the int8 weights and zero points `MatMulInteger` nodes multiply by as
    uint8 (+128: the high bit flipped); returns how many tensors changed, 0 (and `model` as it was)
    when one of them is stored in a way that cannot be rewritten in place."""
    import numpy as np

    view = memoryview(model)
    graph = next((s for f, s in _fields(view, 0, len(view)) if f == _MODEL_GRAPH), None)
    if graph is None:
        return 0
    weights: set[bytes] = set()
    tensors = []
    for field, (start, end) in _fields(view, *graph):
        if field == _GRAPH_NODE:
            parts = list(_fields(view, start, end))
            op = [bytes(view[a:b]) for f, (a, b) in parts if f == _NODE_OP_TYPE]
            inputs = [bytes(view[a:b]) for f, (a, b) in parts if f == _NODE_INPUT]
            if op == [b"MatMulInteger"]:
                weights.update(inputs[1::2])  # B, and B's zero point (inputs 1 and 3)
        elif field == _GRAPH_INITIALIZER:
            tensors.append((start, end))
    plans = [_plan(view, start, end, weights) for start, end in tensors]
    if any(p is False for p in plans):
        return 0
    as_array = np.frombuffer(model, dtype=np.uint8)  # shares `model`'s bytes
    changed = [p for p in plans if p]
    for type_at, key_at, (start, end) in changed:
        model[type_at] = _UINT8  # a one-byte varint either way
        if key_at is not None:
            model[key_at] = _RAW_DATA_KEY
        as_array[start:end] ^= 0x80
    return len(changed)


def _plan(view: memoryview, start: int, end: int, weights: set[bytes]):
    """How to rewrite the tensor in `view[start:end]`: None (not a weight of `weights`, or not
    int8), False (one that cannot be rewritten in place), else where its type is, the key of an
    `int32_data` field to make `raw_data` (None when raw already), and the span of its bytes."""
    spans = {f: span for f, span in _fields(view, start, end)}
    name = spans.get(_TENSOR_NAME)
    if name is None or bytes(view[name[0] : name[1]]) not in weights:
        return None
    if _TENSOR_DATA_TYPE not in spans or view[spans[_TENSOR_DATA_TYPE][0]] != _INT8:
        return None
    if _TENSOR_RAW_DATA in spans:
        return spans[_TENSOR_DATA_TYPE][0], None, spans[_TENSOR_RAW_DATA]
    # int32_data, packed (key 0x2A): one byte a value when all are 0..127 (zero points: 0), so
    # the same bytes are the raw int8 data, and the key becomes raw_data's (one byte too).
    packed = [
        (*s, at) for f, s, at in _fields(view, start, end, keys=True) if f == _TENSOR_INT32_DATA
    ]
    if (
        len(packed) != 1
        or view[packed[0][2]] != _INT32_DATA_KEY
        or any(b >= 0x80 for b in view[packed[0][0] : packed[0][1]])
    ):
        return False
    return spans[_TENSOR_DATA_TYPE][0], packed[0][2], packed[0][:2]


def _fields(buf: memoryview, start: int, end: int, keys: bool = False):
    """The fields of the protobuf message in `buf[start:end]`: (number, (start, end)) of each
    value (a varint's span is its bytes), with where its key is when `keys`."""
    i = start
    while i < end:
        key_at = i
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, j = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            j = i + size
        elif wire in (1, 5):
            j = i + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"not an ONNX model: protobuf wire type {wire} at byte {i}")
        yield (number, (i, j), key_at) if keys else (number, (i, j))
        i = j


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
