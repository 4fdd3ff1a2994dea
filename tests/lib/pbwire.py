"""Protobuf wire format by hand, for the interop tests' foreign clients (Debian's python3-grpcio
has no protobuf code for our .proto files). Only what the tests need: varints, length-delimited
and varint fields, and a flat parse. Not a protobuf implementation."""


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf, i):
    shift = val = 0
    while True:
        b = buf[i]
        i += 1
        val |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return val, i


def field(num, payload, wt=2):
    """A length-delimited field (str or bytes), or with wt=0 a varint field (int)."""
    key = varint((num << 3) | wt)
    if wt == 0:
        return key + varint(payload)
    if isinstance(payload, str):
        payload = payload.encode()
    return key + varint(len(payload)) + payload


def parse(buf):
    """field number -> list of values (ints for varints, bytes otherwise), in wire order."""
    fields, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            val, i = bytes(buf[i:i + n]), i + n
        elif wt == 1:
            val, i = buf[i:i + 8], i + 8
        else:
            raise ValueError("unexpected wire type %d" % wt)
        fields.setdefault(num, []).append(val)
    return fields
