#!/usr/bin/env python3
"""A misbehaving client of `hearth worker`, for the tests: speaks just enough of the protocol
(docs/protocol.md) to be hostile. Loopback only; every mode ends by itself within its hold time.

  hostile-client.py PORT idle N HOLD        N connections that send nothing, held HOLD s
  hostile-client.py PORT hello-silent HOLD  a valid HELLO, then nothing, held HOLD s
  hostile-client.py PORT hello NAME         a HELLO with device NAME (\\x escapes), then BYE with
                                            reason NAME; prints the worker's answer type
  hostile-client.py PORT raw HEX HOLD       bytes as they are, held HOLD s
  hostile-client.py PORT slow HOLD          a valid HELLO one byte every 0.2 s, for at most HOLD s
  hostile-client.py PORT rapid N            N connections opened and closed at once
  hostile-client.py PORT oversized|truncated|magic   a HELLO header announcing 4 GiB / 100 bytes
                                            of which 10 come / with a wrong magic; then the answer
"""
import socket
import struct
import sys
import time

MAGIC, VERSION = 0x48545248, 3  # HN_PROTO_VERSION
HELLO, HELLO_ACK, ERROR, BYE = 1, 2, 3, 16


def frame(mtype, payload, seq=1):
    return struct.pack("<IHHII", MAGIC, VERSION, mtype, len(payload), seq) + payload


def hello(device):
    return frame(HELLO, struct.pack("<IIQ", VERSION, VERSION, 0) + bytes(32) + struct.pack("<I", len(device)) + device)


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def recv_type(s):
    try:
        h = s.recv(16)
    except OSError:
        return "closed"
    if len(h) < 16:
        return "closed"
    return {HELLO_ACK: "HELLO_ACK", ERROR: "ERROR"}.get(struct.unpack("<IHHII", h)[2], "other")


def main():
    port, mode = int(sys.argv[1]), sys.argv[2]
    if mode == "idle":
        conns = [connect(port) for _ in range(int(sys.argv[3]))]
        print("connected", len(conns), flush=True)
        time.sleep(float(sys.argv[4]))
    elif mode == "hello-silent":
        s = connect(port)
        s.sendall(hello(b"silent"))
        print(recv_type(s), flush=True)
        time.sleep(float(sys.argv[3]))
    elif mode == "hello":
        name = sys.argv[3].encode().decode("unicode_escape").encode("latin-1")
        s = connect(port)
        s.sendall(hello(name))
        print(recv_type(s), flush=True)
        # BYE: i32 code, str reason (the same text); a busy worker has closed already
        try:
            s.sendall(frame(BYE, struct.pack("<iI", 0, len(name)) + name, 2))
        except OSError:
            pass
        time.sleep(0.3)
    elif mode == "raw":
        s = connect(port)
        s.sendall(bytes.fromhex(sys.argv[3]))
        time.sleep(float(sys.argv[4]))
    elif mode == "slow":
        s = connect(port)
        end = time.time() + float(sys.argv[3])
        try:
            for byte in hello(b"slow"):
                if time.time() > end:
                    break
                s.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            pass  # dropped by the worker, as it should be
        print("done", flush=True)
    elif mode == "rapid":
        for _ in range(int(sys.argv[3])):
            connect(port).close()
        print("done", flush=True)
    elif mode in ("oversized", "truncated", "magic"):
        s = connect(port)
        if mode == "oversized":
            s.sendall(struct.pack("<IHHII", MAGIC, VERSION, HELLO, 0xFFFFFFF0, 1))
        elif mode == "truncated":
            s.sendall(struct.pack("<IHHII", MAGIC, VERSION, HELLO, 100, 1) + bytes(10))
            s.shutdown(socket.SHUT_WR)
        else:
            s.sendall(struct.pack("<IHHII", 0xDEADBEEF, VERSION, HELLO, 4, 1) + bytes(4))
        print(recv_type(s), flush=True)
    else:
        sys.exit(__doc__)


main()
