#!/usr/bin/env python3
"""JetStream load for nats/run.sh (nats-py, asyncio; 127.0.0.1 only).

  jsload.py stream --url U [--name BENCH] [--subjects 'bench.>'] [--replicas 3]
      (Re)creates a file-backed stream with that many replicas, waits for its leader and prints
      `leader=<server name>`.
  jsload.py publish --url U [--subject bench.load] [--publishers 1] [--window 1] [--batch 1]
                    [--bytes 100] [--seconds 10] [--max-messages 2000000] [--msg-id]
      PUBLISHERS connections, each keeping WINDOW publishes in flight; every publish waits for
      its PubAck, and the time from publish to PubAck is the latency. With --msg-id every
      message carries a unique Nats-Msg-Id (the stream's duplicate detection runs).
      With --batch B (> 1) each of the WINDOW lanes sends B publishes at once and awaits all B
      PubAcks before it sends the next B: the latency is then a batch's, from its first publish
      to its last PubAck (as a client that publishes a batch and waits for the batch's ack).
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

    acked = [0]

    def headers_of(lane_id, count):
        return {"Nats-Msg-Id": f"{prefix}-{lane_id}-{count}"} if args.msg_id else None

    async def lane(js, lane_id):
        count = 0
        while time.monotonic() < stop_at and sent[0] < args.max_messages:
            sent[0] += 1
            count += 1
            before = time.monotonic()
            try:
                await js.publish(args.subject, payload, headers=headers_of(lane_id, count))
            except Exception:  # a timeout or an error reply: counted, never retried
                errors[0] += 1
                continue
            latencies.append(time.monotonic() - before)
            acked[0] += 1

    async def batch_lane(js, lane_id):
        count = 0
        while time.monotonic() < stop_at and sent[0] < args.max_messages:
            size = min(args.batch, args.max_messages - sent[0])
            sent[0] += size
            before = time.monotonic()
            if hasattr(js, "publish_async"):
                # Sent at once, the PubAcks on one shared reply subscription: no task per message.
                futures = []
                for _ in range(size):
                    count += 1
                    futures.append(await js.publish_async(args.subject, payload, headers=headers_of(lane_id, count)))
                try:
                    await asyncio.wait_for(asyncio.wait(futures), timeout=10)
                except asyncio.TimeoutError:
                    pass
                results = [future.exception() if future.done() else asyncio.TimeoutError() for future in futures]
                for future in futures:
                    future.cancel()  # the ones still waiting: counted as errors below
            else:  # an older nats-py: one request per message, gathered
                publishes = []
                for _ in range(size):
                    count += 1
                    publishes.append(js.publish(args.subject, payload, headers=headers_of(lane_id, count)))
                results = await asyncio.gather(*publishes, return_exceptions=True)
            failed = sum(isinstance(result, BaseException) for result in results)
            errors[0] += failed  # counted, never retried
            acked[0] += size - failed
            if not failed:
                latencies.append(time.monotonic() - before)

    lanes = []
    for number, connection in enumerate(connections):
        js = connection.jetstream(timeout=10)
        run = batch_lane if args.batch > 1 else lane
        lanes += [run(js, f"{number}.{slot}") for slot in range(args.window)]
    await asyncio.gather(*lanes)
    elapsed = time.monotonic() - began
    for connection in connections:
        await connection.close()
    latencies.sort()
    print(f"load=jetstream-publish acked={acked[0]} seconds={elapsed:.2f} ops_per_s={acked[0] / elapsed:.0f} "
          f"{latency_ms(latencies)} latency_of={'batch' if args.batch > 1 else 'publish'} errors={errors[0]} "
          f"publishers={args.publishers} window={args.window} batch={args.batch} bytes={args.bytes} "
          f"msg_id={'yes' if args.msg_id else 'no'}")


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
    one.add_argument("--batch", type=int, default=1)
    one.add_argument("--bytes", type=int, default=100)
    one.add_argument("--seconds", type=float, default=10)
    one.add_argument("--max-messages", type=int, default=2_000_000)
    one.add_argument("--msg-id", action="store_true")
    one.set_defaults(run=publish)
    args = parser.parse_args()
    asyncio.run(args.run(args))


if __name__ == "__main__":
    main()
