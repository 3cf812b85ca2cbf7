#!/usr/bin/env python3
"""JetStream load for nats/run.sh (nats-py, asyncio; 127.0.0.1 only).

  jsload.py stream --url U [--name BENCH] [--subjects 'bench.>'] [--replicas 3]
      (Re)creates a file-backed stream with that many replicas, waits for its leader and prints
      `leader=<server name>`.
  jsload.py publish --url U [--subject bench.load] [--publishers 1] [--window 1] [--bytes 100]
                    [--seconds 10] [--max-messages 2000000] [--msg-id]
      PUBLISHERS connections, each keeping WINDOW publishes in flight; every publish waits for
      its PubAck, and the time from publish to PubAck is the latency. With --msg-id every
      message carries a unique Nats-Msg-Id (the stream's duplicate detection runs).
The load generator is one Python process: on a small machine it shares the cores with the
servers, and at high rates its own CPU is part of what is measured.
"""
import argparse
import asyncio
import os
import sys
import time

import nats
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from stats import latency_ms  # noqa: E402


async def make_stream(args):
    connection = await nats.connect(args.url, connect_timeout=5)
    try:
        js = connection.jetstream(timeout=10)
        try:
            await js.delete_stream(args.name)
        except NotFoundError:
            pass
        await js.add_stream(StreamConfig(name=args.name, subjects=[args.subjects], storage=StorageType.FILE,
                                         num_replicas=args.replicas, duplicate_window=120.0))
        give_up = time.monotonic() + 30
        while True:
            info = await js.stream_info(args.name)
            leader = info.cluster.leader if info.cluster else None
            if leader:
                print(f"leader={leader} replicas={args.replicas}")
                return
            if time.monotonic() > give_up:
                raise SystemExit("the stream has no leader after 30 s")
            await asyncio.sleep(0.1)
    finally:
        await connection.close()


async def publish(args):
    payload = os.urandom(args.bytes // 2 + 1).hex()[: args.bytes].encode()
    connections = [await nats.connect(args.url, connect_timeout=5) for _ in range(args.publishers)]
    latencies, errors = [], [0]
    sent = [0]
    began = time.monotonic()
    stop_at = began + args.seconds
    prefix = os.urandom(4).hex()

    async def lane(js, lane_id):
        count = 0
        while time.monotonic() < stop_at and sent[0] < args.max_messages:
            sent[0] += 1
            count += 1
            headers = {"Nats-Msg-Id": f"{prefix}-{lane_id}-{count}"} if args.msg_id else None
            before = time.monotonic()
            try:
                await js.publish(args.subject, payload, headers=headers)
            except Exception:  # a timeout or an error reply: counted, never retried
                errors[0] += 1
                continue
            latencies.append(time.monotonic() - before)

    lanes = []
    for number, connection in enumerate(connections):
        js = connection.jetstream(timeout=10)
        lanes += [lane(js, f"{number}.{slot}") for slot in range(args.window)]
    await asyncio.gather(*lanes)
    elapsed = time.monotonic() - began
    for connection in connections:
        await connection.close()
    latencies.sort()
    print(f"load=jetstream-publish acked={len(latencies)} seconds={elapsed:.2f} ops_per_s={len(latencies) / elapsed:.0f} "
          f"{latency_ms(latencies)} errors={errors[0]} "
          f"publishers={args.publishers} window={args.window} bytes={args.bytes} msg_id={'yes' if args.msg_id else 'no'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("stream")
    one.add_argument("--url", required=True)
    one.add_argument("--name", default="BENCH")
    one.add_argument("--subjects", default="bench.>")
    one.add_argument("--replicas", type=int, default=3)
    one.set_defaults(run=make_stream)
    one = commands.add_parser("publish")
    one.add_argument("--url", required=True)
    one.add_argument("--subject", default="bench.load")
    one.add_argument("--publishers", type=int, default=1)
    one.add_argument("--window", type=int, default=1)
    one.add_argument("--bytes", type=int, default=100)
    one.add_argument("--seconds", type=float, default=10)
    one.add_argument("--max-messages", type=int, default=2_000_000)
    one.add_argument("--msg-id", action="store_true")
    one.set_defaults(run=publish)
    args = parser.parse_args()
    asyncio.run(args.run(args))


if __name__ == "__main__":
    main()
