#!/usr/bin/env python3
"""Prints row ROW of tensor NAME of a GGUF file as the hex of its float32 values (F32, F16, Q8_0),
read independently of hearth: the bytes a hidden state holds when it is that embedding row
(tests/test-trust.sh searches captured traffic for them).

  gguf-row.py FILE NAME ROW
"""
import struct, sys
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
b = open(sys.argv[1], "rb").read()
want, row = sys.argv[2], int(sys.argv[3])
n_t, n_kv = struct.unpack_from("<QQ", b, 8)
p = 24
def string(p):
    n = struct.unpack_from("<Q", b, p)[0]
    return b[p + 8:p + 8 + n].decode("utf-8", "replace"), p + 8 + n
def value(t, p):
    if t in SCALAR:
        f = "<" + SCALAR[t]
        return struct.unpack_from(f, b, p)[0], p + struct.calcsize(f)
    if t == 8:
        return string(p)
    if t == 9:
        et, n = struct.unpack_from("<IQ", b, p)
        p += 12
        out = []
        for _ in range(n):
            v, p = value(et, p)
            out.append(v)
        return out, p
    raise SystemExit("bad kv type %d" % t)
align = 32
for _ in range(n_kv):
    k, p = string(p)
    t = struct.unpack_from("<I", b, p)[0]
    v, p = value(t, p + 4)
    if k == "general.alignment":
        align = v
tensors = {}
for _ in range(n_t):
    name, p = string(p)
    nd = struct.unpack_from("<I", b, p)[0]
    ne = struct.unpack_from("<%dQ" % nd, b, p + 4)
    p += 4 + 8 * nd
    typ, off = struct.unpack_from("<IQ", b, p)
    p += 12
    tensors[name] = (ne, typ, off)
base = (p + align - 1) // align * align
ne, typ, off = tensors[want]
n = ne[0]
if typ == 0:
    vals = struct.unpack_from("<%df" % n, b, base + off + 4 * n * row)
elif typ == 1:
    vals = struct.unpack_from("<%de" % n, b, base + off + 2 * n * row)
elif typ == 8:
    vals = []
    q0 = base + off + (n // 32) * 34 * row
    for blk in range(n // 32):
        d = struct.unpack_from("<e", b, q0 + 34 * blk)[0]
        vals += [d * q for q in struct.unpack_from("<32b", b, q0 + 34 * blk + 2)]
else:
    raise SystemExit("tensor type %d not handled" % typ)
sys.stdout.write(struct.pack("<%df" % n, *vals).hex())
