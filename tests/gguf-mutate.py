#!/usr/bin/env python3
"""Changes one metadata value or one tensor's shape of a GGUF file in place, keeping its size, for
the tests of what hearth does with a damaged file.

  gguf-mutate.py FILE kv KEY DELTA       adds DELTA to a numeric scalar value (u32/i32/f32/u64/...)
  gguf-mutate.py FILE swap-dims PATTERN  swaps ne[0] and ne[1] of the first 2-D tensor whose name
                                         contains PATTERN and whose dims differ
  gguf-mutate.py FILE nan NAME           fills the F32 tensor NAME with NaN
  gguf-mutate.py FILE flip PATTERN       inverts the first data byte of the first tensor whose name
                                         contains PATTERN
"""
import struct
import sys

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def main():
    path, mode, arg = sys.argv[1], sys.argv[2], sys.argv[3]
    b = bytearray(open(path, "rb").read())
    pos = 8
    n_t, n_kv = struct.unpack_from("<QQ", b, pos)
    pos += 16

    def string(p):
        n = struct.unpack_from("<Q", b, p)[0]
        return b[p + 8:p + 8 + n].decode("utf-8", "replace"), p + 8 + n

    def skip_value(t, p):
        if t in SCALAR:
            return p + struct.calcsize("<" + SCALAR[t])
        if t == 8:
            return string(p)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", b, p)
            p += 12
            for _ in range(n):
                p = skip_value(et, p)
            return p
        sys.exit("unknown type %d" % t)

    align = 32
    for _ in range(n_kv):
        key, pos = string(pos)
        t = struct.unpack_from("<I", b, pos)[0]
        pos += 4
        if mode == "kv" and key == arg and t in SCALAR:
            fmt = "<" + SCALAR[t]
            v = struct.unpack_from(fmt, b, pos)[0]
            nv = v + (float(sys.argv[4]) if t in (6, 12) else int(sys.argv[4]))
            struct.pack_into(fmt, b, pos, nv)
            open(path, "wb").write(b)
            print("%s: %s -> %s" % (key, v, nv))
            return
        if key == "general.alignment" and t == 4:
            align = struct.unpack_from("<I", b, pos)[0]
        pos = skip_value(t, pos)
    infos = []
    for _ in range(n_t):
        name, pos = string(pos)
        nd = struct.unpack_from("<I", b, pos)[0]
        dims_at = pos + 4
        ne = list(struct.unpack_from("<%dQ" % nd, b, dims_at))
        ttype, off = struct.unpack_from("<IQ", b, dims_at + 8 * nd)
        infos.append((name, ne, ttype, off))
        pos = dims_at + 8 * nd + 4 + 8
        if mode == "swap-dims" and arg in name and nd == 2 and ne[0] != ne[1]:
            struct.pack_into("<QQ", b, dims_at, ne[1], ne[0])
            open(path, "wb").write(b)
            print("%s: %s -> %s" % (name, ne, [ne[1], ne[0]]))
            return
    data = (pos + align - 1) // align * align
    for name, ne, ttype, off in infos:
        if mode == "nan" and name == arg and ttype == 0:
            n = 1
            for d in ne:
                n *= d
            struct.pack_into("<%df" % n, b, data + off, *([float("nan")] * n))
            open(path, "wb").write(b)
            print("%s: %d NaN" % (name, n))
            return
        if mode == "flip" and arg in name:
            b[data + off] ^= 0xFF
            open(path, "wb").write(b)
            print("%s: first byte inverted" % name)
            return
    sys.exit("nothing to change for %s %s" % (mode, arg))


main()
