#!/usr/bin/env python3
"""The machine's own limits, the floor under every peer's figures (standard library only).

  limits.py fsync --dir D --block B [--mode append|overwrite] [--max-ops N] [--max-seconds S]
      write B bytes then fdatasync, again and again: how many durable appends per second the
      disk gives one writer, and the latency of each (append: the file grows, as a fresh log
      segment does; overwrite: the same preallocated 64 MiB file is rewritten in a circle).
  limits.py seq --dir D [--block B] [--total BYTES] [--max-seconds S]
      write TOTAL bytes in B-byte writes without syncing, then one fdatasync: the sequential
      bandwidth to the disk (and to the page cache alone).
  limits.py rtt [--size B] [--max-trips N] [--max-seconds S]
      one TCP connection on 127.0.0.1 (TCP_NODELAY) to an echo process: request/response
      round trip of B bytes. Both ends are Python, so a few microseconds per side are the
      interpreter's.

Each prints one line of key=value pairs. Every loop is bounded by a count and by time; the
test files are removed at the end.
"""
import argparse
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from stats import quantile  # noqa: E402


def fsync_loop(args):
    path = os.path.join(args.dir, f"fsync-{os.getpid()}.dat")
    payload = os.urandom(args.block)
    ring = 64 << 20
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        if args.mode == "overwrite":
            chunk = b"\0" * (1 << 20)
            for _ in range(ring >> 20):
                os.write(fd, chunk)
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        took = []
        offset = 0
        started = time.perf_counter()
        deadline = started + args.max_seconds
        while len(took) < args.max_ops:
            before = time.perf_counter()
            if before > deadline:
                break
            if args.mode == "overwrite" and offset + args.block > ring:
                os.lseek(fd, 0, os.SEEK_SET)
                offset = 0
            os.write(fd, payload)
            os.fdatasync(fd)
            offset += args.block
            took.append(time.perf_counter() - before)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)
    took.sort()
    us = lambda v: f"{v * 1e6:.0f}"
    print(f"probe=fsync mode={args.mode} block={args.block} ops={len(took)} seconds={elapsed:.2f} "
          f"syncs_per_s={len(took) / elapsed:.0f} mb_per_s={len(took) * args.block / elapsed / 1e6:.2f} "
          f"p50_us={us(quantile(took, .50))} p99_us={us(quantile(took, .99))} max_us={us(took[-1])}")


def sequential(args):
    path = os.path.join(args.dir, f"seq-{os.getpid()}.dat")
    payload = os.urandom(args.block)
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        written = 0
        started = time.perf_counter()
        deadline = started + args.max_seconds
        while written < args.total and time.perf_counter() < deadline:
            written += os.write(fd, payload)
        cached = time.perf_counter()
        os.fdatasync(fd)
        synced = time.perf_counter()
    finally:
        os.close(fd)
        os.unlink(path)
    mb = written / 1e6
    print(f"probe=seq block={args.block} bytes={written} write_s={cached - started:.3f} "
          f"sync_s={synced - cached:.3f} page_cache_mb_per_s={mb / (cached - started):.0f} "
          f"disk_mb_per_s={mb / (synced - started):.0f}")


def read_exactly(conn, size):
    data = b""
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            return None
        data += part
    return data


def round_trips(args):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    child = os.fork()
    if child == 0:  # the echo end: answers until the other end closes
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            data = read_exactly(conn, args.size)
            if data is None:
                os._exit(0)
            conn.sendall(data)
    listener.close()
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    message = os.urandom(args.size)
    took = []
    started = time.perf_counter()
    deadline = started + args.max_seconds
    try:
        while len(took) < args.max_trips:
            before = time.perf_counter()
            if before > deadline:
                break
            conn.sendall(message)
            if read_exactly(conn, args.size) is None:
                break
            took.append(time.perf_counter() - before)
    finally:
        conn.close()
        os.waitpid(child, 0)
    elapsed = time.perf_counter() - started
    took.sort()
    print(f"probe=rtt size={args.size} trips={len(took)} seconds={elapsed:.2f} "
          f"trips_per_s={len(took) / elapsed:.0f} p50_us={quantile(took, .50) * 1e6:.1f} "
          f"p99_us={quantile(took, .99) * 1e6:.1f} max_us={took[-1] * 1e6:.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("fsync")
    one.add_argument("--dir", required=True)
    one.add_argument("--block", type=int, required=True)
    one.add_argument("--mode", choices=("append", "overwrite"), default="append")
    one.add_argument("--max-ops", type=int, default=100_000)
    one.add_argument("--max-seconds", type=float, default=5)
    one.set_defaults(run=fsync_loop)
    one = commands.add_parser("seq")
    one.add_argument("--dir", required=True)
    one.add_argument("--block", type=int, default=1 << 20)
    one.add_argument("--total", type=int, default=1 << 30)
    one.add_argument("--max-seconds", type=float, default=30)
    one.set_defaults(run=sequential)
    one = commands.add_parser("rtt")
    one.add_argument("--size", type=int, default=100)
    one.add_argument("--max-trips", type=int, default=200_000)
    one.add_argument("--max-seconds", type=float, default=5)
    one.set_defaults(run=round_trips)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
