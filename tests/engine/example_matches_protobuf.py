"""kiln's tf.train.Example and TFRecord encoding against Python's protobuf
runtime (Debian's python3-protobuf), with no TensorFlow and no protoc: the
Example messages are declared here as a FileDescriptorProto (the fields of
tensorflow/core/example/{example,feature}.proto) and built with
message_factory. Records kiln writes parse in Python with the values kiln
put there and CRCs that match a CRC32C computed here; records Python writes
(every feature kind, several values, negative and 64-bit ints, an empty
feature) decode in kiln to the same values.
Usage: example_matches_protobuf.py EXAMPLE_TOOL WORKDIR (exit 77: no protobuf)."""
import json
import os
import struct
import subprocess
import sys

try:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError:
    print("SKIPPED: Python's protobuf runtime is missing (Debian: python3-protobuf)")
    sys.exit(77)

tool, work = sys.argv[1], sys.argv[2]


def example_classes():
    f = descriptor_pb2.FileDescriptorProto(name="kiln_example.proto", package="tensorflow",
                                           syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    def msg(name, fields):
        m = f.message_type.add(name=name)
        for number, fname, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name
        return m
    rep, opt = T.LABEL_REPEATED, T.LABEL_OPTIONAL
    msg("BytesList", [(1, "value", T.TYPE_BYTES, rep, None)])
    msg("FloatList", [(1, "value", T.TYPE_FLOAT, rep, None)])
    msg("Int64List", [(1, "value", T.TYPE_INT64, rep, None)])
    feature = msg("Feature", [(1, "bytes_list", T.TYPE_MESSAGE, opt, ".tensorflow.BytesList"),
                              (2, "float_list", T.TYPE_MESSAGE, opt, ".tensorflow.FloatList"),
                              (3, "int64_list", T.TYPE_MESSAGE, opt, ".tensorflow.Int64List")])
    feature.oneof_decl.add(name="kind")
    for fd in feature.field:
        fd.oneof_index = 0
    features = msg("Features", [(1, "feature", T.TYPE_MESSAGE, rep,
                                 ".tensorflow.Features.FeatureEntry")])
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=T.TYPE_STRING, label=opt)
    entry.field.add(name="value", number=2, type=T.TYPE_MESSAGE, label=opt,
                    type_name=".tensorflow.Feature")
    entry.options.map_entry = True
    msg("Example", [(1, "features", T.TYPE_MESSAGE, opt, ".tensorflow.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = message_factory.MessageFactory(pool).GetPrototype
    return get(pool.FindMessageTypeByName("tensorflow.Example"))


Example = example_classes()

# CRC32C (Castagnoli), reflected, as TFRecord masks it.
TABLE = []
for n in range(256):
    c = n
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    TABLE.append(c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the published check value


def read_records(path):
    data = open(path, "rb").read()
    at, out = 0, []
    while at < len(data):
        head = data[at:at + 8]
        (n,) = struct.unpack("<Q", head)
        (crc,) = struct.unpack("<I", data[at + 8:at + 12])
        assert crc == masked(head), f"record {len(out)}: length CRC"
        body = data[at + 12:at + 12 + n]
        (crc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
        assert crc == masked(body), f"record {len(out)}: data CRC"
        out.append(body)
        at += 16 + n
    return out


def varint(data, at):
    value, shift = 0, 0
    while True:
        b = data[at]
        value |= (b & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not b & 0x80:
            return value, at


def fields(data):
    """The length-delimited fields of a message: (number, bytes)."""
    at, out = 0, []
    while at < len(data):
        tag, at = varint(data, at)
        assert tag & 7 == 2, tag
        n, at = varint(data, at)
        out.append((tag >> 3, data[at:at + n]))
        at += n
    return out


def entries(example):
    """The serialized map entries of an Example's features."""
    (number, features), = fields(example)
    assert number == 1
    return [entry for number, entry in fields(features) if number == 1]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


# (1) kiln writes, Python reads.
path = os.path.join(work, "kiln.tfrecord")
subprocess.run([tool, "encode", path], check=True)
records = read_records(path)
assert len(records) == 3, len(records)
for i, raw in enumerate(records):
    ex = Example()
    ex.ParseFromString(raw)
    feat = ex.features.feature
    assert sorted(feat) == ["floats", "image/encoded", "ints", "label"], sorted(feat)
    assert feat["image/encoded"].bytes_list.value == [bytes((i * 40 + k * 50) % 256 for k in range(5))]
    assert list(feat["floats"].float_list.value) == [f32(i + 0.5), -1.25, f32(3e10)]
    assert list(feat["ints"].int64_list.value) == [i, -7, 1 << 40]
    assert list(feat["label"].int64_list.value) == [i]
    # Each map entry is byte for byte the one protobuf serializes (a map's
    # order is the writer's: kiln keeps the order it was given).
    mine = sorted(entries(raw))
    theirs = []
    for key in feat:
        one = Example()
        one.features.feature[key].CopyFrom(feat[key])
        theirs += entries(one.SerializeToString())
    assert mine == sorted(theirs), f"record {i}: entries differ"
print("kiln's 3 records parse in protobuf with their values, CRCs and bytes")

# (2) Python writes, kiln reads.
want = []
path = os.path.join(work, "python.tfrecord")
with open(path, "wb") as out:
    for i in range(4):
        ex = Example()
        feat = ex.features.feature
        feat["img"].bytes_list.value.extend([bytes([i, 255, 0]), b"", b"\x80" * 300])
        feat["f"].float_list.value.extend([i / 3, -0.0, 1e-38, 65504.0])
        feat["i"].int64_list.value.extend([-(1 << 63), (1 << 63) - 1, i, -1])
        feat["empty"].SetInParent()  # a feature with no kind set
        raw = ex.SerializeToString()
        out.write(struct.pack("<Q", len(raw)) + struct.pack("<I", masked(struct.pack("<Q", len(raw)))))
        out.write(raw + struct.pack("<I", masked(raw)))
        want.append({
            "img": {"kind": "bytes", "values": [bytes([i, 255, 0]).hex(), "", "80" * 300]},
            "f": {"kind": "float", "values": [f32(i / 3), -0.0, f32(1e-38), 65504.0]},
            "i": {"kind": "int64", "values": [-(1 << 63), (1 << 63) - 1, i, -1]},
            "empty": {"kind": "none", "values": []},
        })
got = subprocess.run([tool, "decode", path], check=True, capture_output=True, text=True).stdout
lines = [json.loads(line) for line in got.splitlines()]
assert len(lines) == 4, got
for i, (g, w) in enumerate(zip(lines, want)):
    assert g.keys() == w.keys(), (i, g.keys())
    for name in w:
        assert g[name]["kind"] == w[name]["kind"], (i, name, g[name])
        gv, wv = g[name]["values"], w[name]["values"]
        if w[name]["kind"] == "float":
            gv = [f32(v) for v in gv]
        assert gv == wv, (i, name, gv, wv)
print("protobuf's 4 records (every kind, an empty feature) decode in kiln to their values")
