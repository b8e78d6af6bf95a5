"""Copies a safetensors file with one value of one tensor replaced by NaN (standard library only):
nonfinite_weights.py SOURCE DESTINATION TENSOR INDEX"""
import json
import struct
import sys

source, destination, tensor, index = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
data = bytearray(open(source, "rb").read())
header_size = struct.unpack("<Q", data[:8])[0]
entry = json.loads(data[8 : 8 + header_size])[tensor]
assert entry["dtype"] == "F32", entry
at = 8 + header_size + entry["data_offsets"][0] + 4 * index
data[at : at + 4] = struct.pack("<f", float("nan"))
open(destination, "wb").write(data)
