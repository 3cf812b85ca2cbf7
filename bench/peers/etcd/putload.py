#!/usr/bin/env python3
"""Put load for etcd/run.sh over etcd's gRPC API (grpcio, asyncio; 127.0.0.1 only).

  putload.py put --endpoints H:P[,H:P...] [--clients 1] [--conns 1] [--value-bytes 100]
                 [--keyspace 100000] [--seconds 10] [--max-puts 2000000]
      CLIENTS writers, each doing one Put at a time (a random key of KEYSPACE, a VALUE-BYTES
      value), spread over CONNS gRPC connections, which are spread over the endpoints. A Put
      returns once raft committed it (the leader and a quorum fsynced it to their WAL) and the
      leader applied it. Prints `load=etcd-put ...`.
  putload.py leader --endpoints H:P,...
      Prints `leader=H:P`, the endpoint whose member leads, from etcd's Status call.
The messages are encoded by hand (a PutRequest is a key and a value), so no generated stubs or
protobuf package are needed. One Python process: on a small machine it shares the cores with
the members, and its own CPU is part of what is measured.
"""
import argparse
import asyncio
import os
import random
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from stats import latency_ms  # noqa: E402

PUT = "/etcdserverpb.KV/Put"
STATUS = "/etcdserverpb.Maintenance/Status"


def varint(value):
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def put_request(key, value):
    return b"\x0a" + varint(len(key)) + key + b"\x12" + varint(len(value)) + value


def read_varint(data, at):
    shift = value = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def fields(data):
    """{field number: [values]} of a protobuf message (varints as ints, the rest as bytes)."""
    out, at = {}, 0
    while at < len(data):
        key, at = read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = read_varint(data, at)
        elif wire == 2:
            size, at = read_varint(data, at)
            value, at = data[at:at + size], at + size
        elif wire == 1:
            value, at = data[at:at + 8], at + 8
        elif wire == 5:
            value, at = data[at:at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def channel(endpoint):
    # A local subchannel pool: each channel gets its own TCP connection.
    return grpc.aio.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)])


async def leader(args):
    for endpoint in args.endpoints.split(","):
        async with channel(endpoint) as ch:
            reply = fields(await ch.unary_unary(STATUS)(b"", timeout=10))
        # StatusResponse: header = 1 (ResponseHeader: member_id = 2), leader = 4
        member = fields(reply[1][0])[2][0]
        if reply.get(4, [None])[0] == member:
            print(f"leader={endpoint}")
            return
    raise SystemExit("no member says it leads")


async def put(args):
    endpoints = args.endpoints.split(",")
    channels = [channel(endpoints[i % len(endpoints)]) for i in range(args.conns)]
    calls = [ch.unary_unary(PUT) for ch in channels]
    value = os.urandom(args.value_bytes // 2 + 1).hex()[: args.value_bytes].encode()
    latencies, errors, started = [], [0], [0]
    began = time.monotonic()
    stop_at = began + args.seconds

    async def writer(number):
        call = calls[number % len(calls)]
        draw = random.Random(number)
        while time.monotonic() < stop_at and started[0] < args.max_puts:
            started[0] += 1
            key = f"peers/{draw.randrange(args.keyspace):08d}".encode()
            before = time.monotonic()
            try:
                await call(put_request(key, value), timeout=10)
            except grpc.aio.AioRpcError:  # counted, never retried
                errors[0] += 1
                continue
            latencies.append(time.monotonic() - before)

    await asyncio.gather(*(writer(n) for n in range(args.clients)))
    elapsed = time.monotonic() - began
    for ch in channels:
        await ch.close()
    latencies.sort()
    print(f"load=etcd-put puts={len(latencies)} seconds={elapsed:.2f} ops_per_s={len(latencies) / elapsed:.0f} "
          f"{latency_ms(latencies)} errors={errors[0]} "
          f"clients={args.clients} conns={args.conns} value_bytes={args.value_bytes}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("put")
    one.add_argument("--endpoints", required=True)
    one.add_argument("--clients", type=int, default=1)
    one.add_argument("--conns", type=int, default=1)
    one.add_argument("--value-bytes", type=int, default=100)
    one.add_argument("--keyspace", type=int, default=100_000)
    one.add_argument("--seconds", type=float, default=10)
    one.add_argument("--max-puts", type=int, default=2_000_000)
    one.set_defaults(run=put)
    one = commands.add_parser("leader")
    one.add_argument("--endpoints", required=True)
    one.set_defaults(run=leader)
    args = parser.parse_args()
    asyncio.run(args.run(args))


if __name__ == "__main__":
    main()
