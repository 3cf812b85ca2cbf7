#!/usr/bin/env python3
"""JetStream load for nats/run.sh (nats-py, asyncio; 127.0.0.1 only).

  jsload.py stream --url U [--name BENCH] [--subjects 'bench.>'] [--replicas 3] [--retention limits]
      (Re)creates a file-backed stream with that many replicas, waits for its leader and prints
      `leader=<server name>`. `--retention workqueue`: a message is removed once a consumer acked it.
  jsload.py publish --url U [--subject bench.load] [--publishers 1] [--window 1] [--batch 1]
                    [--bytes 100] [--seconds 10] [--max-messages 2000000] [--msg-id]
      PUBLISHERS connections, each keeping WINDOW publishes in flight; every publish waits for
      its PubAck, and the time from publish to PubAck is the latency. With --msg-id every
      message carries a unique Nats-Msg-Id (the stream's duplicate detection runs).
      With --batch B (> 1) each of the WINDOW lanes sends B publishes at once and awaits all B
      PubAcks before it sends the next B: the latency is then a batch's, from its first publish
      to its last PubAck (as a client that publishes a batch and waits for the batch's ack).
  jsload.py queue --url U [--stream QUEUE] [--subject queue.work] [--pairs 1] [--seconds 8]
                  [--max-messages 500000] [--bytes 100]
      A work queue: STREAM (made by `stream --retention workqueue`) gets a durable pull consumer
      with explicit acks, made anew. PAIRS connections, each looping: publish one message (its
      PubAck awaited), fetch(1) from the consumer (the message may be another pair's), ack_sync
      it (the server's reply to the ack awaited). Round trips/s and the time of one round trip.
      Prints `kind=nats-queue ...`.
  jsload.py queue-latency --url U [--stream QUEUE] [--samples 300] [--gap-ms 10] [--max-seconds 40]
      One receiver parked in fetch(1, timeout=..); a sender on another connection publishes one
      message at a time carrying its send time, GAP ms after the receiver acked the previous one.
      Send -> fetch returns (one process, one clock). Prints `kind=nats-queue-latency ...`.
  jsload.py queue-drain --url U [--stream QUEUE] [--messages 10000] [--batch 1000] [--max-seconds 60]
      Publishes MESSAGES (1000 at a time, every PubAck awaited), then one consumer fetches batches
      of up to BATCH and acks each message (the batch's last with ack_sync: the server processed the
      batch's acks in order) until all are taken: the seconds that took. Prints
      `kind=nats-queue-drain ...`.
The load generator is one Python process: on a small machine it shares the cores with the
servers, and at high rates its own CPU is part of what is measured.
"""
import argparse
import asyncio
import os
import sys
import time

import nats
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
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
        retention = RetentionPolicy.WORK_QUEUE if args.retention == "workqueue" else RetentionPolicy.LIMITS
        await js.add_stream(StreamConfig(name=args.name, subjects=[args.subjects], storage=StorageType.FILE,
                                         num_replicas=args.replicas, duplicate_window=120.0, retention=retention))
        give_up = time.monotonic() + 30
        while True:
            info = await js.stream_info(args.name)
            leader = info.cluster.leader if info.cluster else None
            if leader:
                print(f"leader={leader} replicas={args.replicas} retention={args.retention}")
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


CONSUMER = "worker"


async def fresh_consumer(js, stream):
    """The durable pull consumer CONSUMER on STREAM, explicit acks, made anew."""
    try:
        await js.delete_consumer(stream, CONSUMER)
    except NotFoundError:
        pass
    await js.add_consumer(stream, ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT,
                                                 ack_wait=30.0, max_ack_pending=20_000, max_waiting=512))


async def queue_state(js, stream):
    """`left=.. ack_pending=.. undelivered=..`: messages the stream still holds, taken but not acked,
    not taken yet."""
    stream_info = await js.stream_info(stream)
    consumer = await js.consumer_info(stream, CONSUMER)
    return (f"left={stream_info.state.messages} ack_pending={consumer.num_ack_pending} "
            f"undelivered={consumer.num_pending}")


async def queue(args):
    """PAIRS connections: publish (PubAck), fetch(1), ack_sync; complete round trips."""
    payload = os.urandom(args.bytes // 2 + 1).hex()[: args.bytes].encode()
    connections = [await nats.connect(args.url, connect_timeout=5) for _ in range(args.pairs)]
    admin = connections[0].jetstream(timeout=10)
    await fresh_consumer(admin, args.stream)
    latencies, errors, timeouts, started = [], [0], [0], [0]
    began = time.monotonic()
    stop_at = began + args.seconds

    async def pair(connection):
        js = connection.jetstream(timeout=10)
        subscription = await js.pull_subscribe_bind(durable=CONSUMER, stream=args.stream)
        while time.monotonic() < stop_at and started[0] < args.max_messages:
            started[0] += 1
            before = time.monotonic()
            try:
                await js.publish(args.subject, payload)
                message = (await subscription.fetch(1, timeout=args.fetch_timeout))[0]
                await message.ack_sync(timeout=10)
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                timeouts[0] += 1  # counted, never retried; a message left behind goes to the next fetch
                continue
            except Exception:  # an error reply: counted, never retried
                errors[0] += 1
                continue
            latencies.append(time.monotonic() - before)

    await asyncio.gather(*(pair(connection) for connection in connections))
    elapsed = time.monotonic() - began
    state = await queue_state(admin, args.stream)
    for connection in connections:
        await connection.close()
    latencies.sort()
    print(f"kind=nats-queue pairs={args.pairs} round_trips={len(latencies)} seconds={elapsed:.2f} "
          f"msgs_per_s={len(latencies) / elapsed:.0f} {latency_ms(latencies)} errors={errors[0] + timeouts[0]} "
          f"timeouts={timeouts[0]} {state} bytes={args.bytes}")


async def queue_latency(args):
    """A receiver parked in fetch(1); one publish at a time; publish sent -> fetch returns."""
    sender = await nats.connect(args.url, connect_timeout=5)
    receiver = await nats.connect(args.url, connect_timeout=5)
    js = sender.jetstream(timeout=10)
    await fresh_consumer(js, args.stream)
    subscription = await receiver.jetstream(timeout=10).pull_subscribe_bind(durable=CONSUMER, stream=args.stream)
    pad = b"l" * args.bytes
    began = time.monotonic()
    stop_at = began + args.max_seconds
    samples, expired, ack_errors = [], [0], [0]
    received = asyncio.Event()
    finished = asyncio.Event()

    async def receive():
        while not finished.is_set() and time.monotonic() < stop_at and len(samples) < args.samples:
            try:
                message = (await subscription.fetch(1, timeout=args.fetch_timeout))[0]
            except (asyncio.TimeoutError, nats.errors.TimeoutError):
                expired[0] += 1  # the pull request expired with nothing sent: park again
                continue
            now = time.monotonic()
            samples.append(now - float(message.data.split(b" ", 1)[0]))
            try:
                await message.ack_sync(timeout=10)
            except Exception:  # counted; the message comes back after ack_wait
                ack_errors[0] += 1
            received.set()

    task = asyncio.ensure_future(receive())
    await asyncio.sleep(0.3)  # the receiver's pull request is waiting on the server
    sent = lost = 0
    while sent < args.samples and time.monotonic() < stop_at and not task.done():
        received.clear()
        await js.publish(args.subject, repr(time.monotonic()).encode() + b" " + pad)
        sent += 1
        try:
            await asyncio.wait_for(received.wait(), timeout=max(0.01, min(5.0, stop_at - time.monotonic())))
        except asyncio.TimeoutError:
            lost += 1  # not received within 5 s (or the deadline): no sample
        await asyncio.sleep(args.gap_ms / 1000)  # the receiver has acked and is parked again
    finished.set()
    try:
        await asyncio.wait_for(task, timeout=args.fetch_timeout + 5)
    except asyncio.TimeoutError:
        pass
    state = await queue_state(js, args.stream)
    await receiver.close()
    await sender.close()
    samples.sort()
    print(f"kind=nats-queue-latency samples={len(samples)} sent={sent} lost={lost} {latency_ms(samples)} "
          f"gap_ms={args.gap_ms:g} expired_fetches={expired[0]} ack_errors={ack_errors[0]} "
          f"seconds={time.monotonic() - began:.2f} {state}")


async def queue_drain(args):
    """Publish MESSAGES, then one consumer fetches batches and acks every message; the seconds."""
    connection = await nats.connect(args.url, connect_timeout=5)
    js = connection.jetstream(timeout=10)
    await fresh_consumer(js, args.stream)
    payload = b"w" * args.bytes
    began = time.monotonic()
    stop_at = began + args.max_seconds
    published = errors = 0
    while published < args.messages and time.monotonic() < stop_at:
        size = min(1000, args.messages - published)
        results = await asyncio.gather(*(js.publish(args.subject, payload) for _ in range(size)),
                                       return_exceptions=True)
        failed = sum(isinstance(result, BaseException) for result in results)
        errors += failed
        published += size - failed
    filled = time.monotonic()
    subscription = await js.pull_subscribe_bind(durable=CONSUMER, stream=args.stream)
    drained = fetches = ack_errors = 0
    while drained < published and time.monotonic() < stop_at:
        try:
            messages = await subscription.fetch(args.batch, timeout=5)
        except (asyncio.TimeoutError, nats.errors.TimeoutError):
            break  # nothing left to take within 5 s: stop
        fetches += 1
        for message in messages[:-1]:
            await message.ack()
        try:
            await messages[-1].ack_sync(timeout=10)  # the acks before it were processed in order
        except Exception:  # counted; unacked messages come back after ack_wait
            ack_errors += 1
        drained += len(messages)
    took = time.monotonic() - filled
    # The stream removes an acked message once the consumer's group replicated the ack.
    give_up = time.monotonic() + 10
    while (await js.stream_info(args.stream)).state.messages > 0 and time.monotonic() < give_up:
        await asyncio.sleep(0.01)
    removed_after = time.monotonic() - filled
    state = await queue_state(js, args.stream)
    await connection.close()
    print(f"kind=nats-queue-drain messages={published} drained={drained} seconds={took:.3f} "
          f"msgs_per_s={drained / took:.0f} batch={args.batch} fetches={fetches} "
          f"stream_empty_after_s={removed_after:.3f} fill_seconds={filled - began:.2f} publish_errors={errors} "
          f"ack_errors={ack_errors} "
          f"{state} bytes={args.bytes}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("stream")
    one.add_argument("--url", required=True)
    one.add_argument("--name", default="BENCH")
    one.add_argument("--subjects", default="bench.>")
    one.add_argument("--replicas", type=int, default=3)
    one.add_argument("--retention", choices=("limits", "workqueue"), default="limits")
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
    one = commands.add_parser("queue")
    one.add_argument("--url", required=True)
    one.add_argument("--stream", default="QUEUE")
    one.add_argument("--subject", default="queue.work")
    one.add_argument("--pairs", type=int, default=1)
    one.add_argument("--seconds", type=float, default=8)
    one.add_argument("--max-messages", type=int, default=500_000)
    one.add_argument("--bytes", type=int, default=100)
    one.add_argument("--fetch-timeout", type=float, default=5)
    one.set_defaults(run=queue)
    one = commands.add_parser("queue-latency")
    one.add_argument("--url", required=True)
    one.add_argument("--stream", default="QUEUE")
    one.add_argument("--subject", default="queue.work")
    one.add_argument("--samples", type=int, default=300)
    one.add_argument("--gap-ms", type=float, default=10)
    one.add_argument("--bytes", type=int, default=100)
    one.add_argument("--fetch-timeout", type=float, default=2)
    one.add_argument("--max-seconds", type=float, default=40)
    one.set_defaults(run=queue_latency)
    one = commands.add_parser("queue-drain")
    one.add_argument("--url", required=True)
    one.add_argument("--stream", default="QUEUE")
    one.add_argument("--subject", default="queue.work")
    one.add_argument("--messages", type=int, default=10_000)
    one.add_argument("--batch", type=int, default=1000)
    one.add_argument("--bytes", type=int, default=100)
    one.add_argument("--max-seconds", type=float, default=60)
    one.set_defaults(run=queue_drain)
    args = parser.parse_args()
    asyncio.run(args.run(args))


if __name__ == "__main__":
    main()
