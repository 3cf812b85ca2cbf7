#!/usr/bin/env python3
"""Measurements redis/run.sh cannot make with redis-benchmark (redis-py; 127.0.0.1 only).

  probe.py lag --primary P --replica R [--writes 1000] [--max-seconds 90]
      For each of WRITES sequential writes: SET on the primary (its reply is the ack: with
      appendfsync always the primary has fsynced its AOF), then GET on the replica until the
      value shows: the time from ack to visible. Then as many SET + WAIT <all replicas> 1000.
      Prints `kind=redis-lag ...` (tidal gates reads vis_after_ack_*, timeouts and
      primary_cmds_per_s_during from it).
  probe.py fill --port P [--records 100000] [--bytes 200] [--batch 500] [--max-seconds 180]
                [--key peers:stream] [--sequential-ids]
      XADD RECORDS entries of BYTES bytes, BATCH per pipeline round trip. With --sequential-ids
      the entries get the ids 1-0, 2-0, ... (so that a reader can start a page anywhere).
  probe.py delivery --primary P --replicas R1,R2 [--events 2000] [--rate 200] [--bytes 100]
                    [--max-seconds 60]
      One publisher XADDs EVENTS entries to the primary at RATE per second (one at a time); a
      reader on each replica waits in XREAD BLOCK. The delivery latency of an event is the time
      from the XADD's reply on the publisher to the reply of XREAD that carried it, per replica and
      to the last replica. Prints `kind=redis-stream-delivery ...`.
  probe.py catchup --primary P --replica R --since EPOCH [--max-seconds 300]
      Waits until the replica's link is up and its offset reached the primary's; the seconds
      from EPOCH (the replica's restart) to each.
  probe.py drained --primary P --replicas R1,R2 [--max-seconds 120]
      Seconds until every replica reached the primary's offset (after a load run).
  probe.py counters --port P
      The primary's resync counters and offset.
  probe.py queue --primary P [--pairs 1] [--seconds 8] [--max-messages 500000] [--bytes 100]
      A work queue on one stream with one consumer group (`g`), on the primary. PAIRS threads, each
      with its own connection and consumer name, loop: XADD one entry, XREADGROUP GROUP g cN COUNT 1
      BLOCK .. STREAMS s > (the entry it gets may be another pair's), XACK it. Round trips/s and
      the time of one round trip. Prints `kind=redis-queue ...`.
  probe.py queue-latency --primary P [--samples 300] [--gap-ms 10] [--max-seconds 40]
      One receiver parked in XREADGROUP .. BLOCK; a sender XADDs one entry at a time carrying its
      send time, GAP ms after the receiver acked the previous one (so the receiver is parked
      again). Send -> XREADGROUP reply (one process, one clock). Prints `kind=redis-queue-latency ...`.
  probe.py queue-drain --primary P [--messages 10000] [--batch 1000] [--max-seconds 60]
      XADD MESSAGES entries (pipelined), then one consumer XREADGROUP COUNT BATCH + one XACK of the
      batch's ids until all are taken: the seconds that took. Prints `kind=redis-queue-drain ...`.
Each prints one line of key=value pairs; every loop is bounded by count and time.
"""
import argparse
import os
import sys
import threading
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from stats import latency_ms, ms, quantile  # noqa: E402

LOOPBACK = "127.0.0.1"


def client(port, timeout=30.0):
    return redis.Redis(host=LOOPBACK, port=port, socket_timeout=timeout, socket_connect_timeout=2)


def lag(args):
    primary, replica = client(args.primary), client(args.replica)
    key = "peers:lag"
    primary.set(key, 0)
    commands_before = int(primary.info("stats")["total_commands_processed"])
    began = time.monotonic()
    stop_at = began + args.max_seconds
    after_ack, from_send, slow = [], [], []
    timeouts = reads = 0
    for n in range(1, args.writes + 1):
        if time.monotonic() > stop_at:
            break
        sent = time.monotonic()
        primary.set(key, n)
        acked = time.monotonic()
        give_up = acked + 5.0
        while True:
            seen = replica.get(key)
            reads += 1
            now = time.monotonic()
            if seen is not None and int(seen) >= n:
                after_ack.append(now - acked)
                from_send.append(now - sent)
                if now - acked > 0.1:
                    slow.append(f"{now - acked:.3f}s")
                break
            if now > give_up:
                timeouts += 1
                break
    replicas = int(primary.info("replication")["connected_slaves"])
    waited, short = [], 0
    for n in range(len(after_ack)):
        if time.monotonic() > stop_at:
            break
        sent = time.monotonic()
        primary.set(key, -n)
        confirmed = primary.execute_command("WAIT", replicas, 1000)
        waited.append(time.monotonic() - sent)
        short += int(confirmed) < replicas
    elapsed = time.monotonic() - began
    commands = int(primary.info("stats")["total_commands_processed"]) - commands_before
    after_ack.sort()
    from_send.sort()
    waited.sort()
    print(f"kind=redis-lag writes={len(after_ack)} timeouts={timeouts} "
          f"vis_after_ack_p50_ms={ms(quantile(after_ack, .5))} vis_after_ack_p99_ms={ms(quantile(after_ack, .99))} "
          f"vis_after_ack_max_ms={ms(after_ack[-1] if after_ack else float('nan'))} "
          f"sent_to_visible_p50_ms={ms(quantile(from_send, .5))} sent_to_visible_p99_ms={ms(quantile(from_send, .99))} "
          f"wait_all_n={len(waited)} wait_all_replicas={replicas} wait_all_p50_ms={ms(quantile(waited, .5))} "
          f"wait_all_p99_ms={ms(quantile(waited, .99))} wait_all_short={short} "
          f"primary_cmds_per_s_during={commands / elapsed:.0f} replica_reads={reads} "
          f"slow_count={len(slow)} slow={','.join(slow[:8]) or '-'}")


def fill(args):
    primary = client(args.port)
    body = b"r" * args.bytes
    began = time.monotonic()
    stop_at = began + args.max_seconds
    done = 0
    while done < args.records and time.monotonic() < stop_at:
        batch = primary.pipeline(transaction=False)
        count = min(args.batch, args.records - done)
        for n in range(done + 1, done + count + 1):
            batch.xadd(args.key, {"b": body}, id=f"{n}-0" if args.sequential_ids else "*")
        batch.execute()
        done += count
    elapsed = time.monotonic() - began
    print(f"kind=redis-fill records={done} seconds={elapsed:.2f} records_per_s={done / elapsed:.0f} "
          f"record_bytes={args.bytes} key={args.key} length={primary.xlen(args.key)} "
          f"primary_offset={primary.info('replication')['master_repl_offset']}")


def delivery(args):
    """XADD on the primary at a bounded rate; XREAD BLOCK on every replica; ack -> read latency."""
    primary = client(args.primary)
    ports = [int(port) for port in args.replicas.split(",")]
    key = "peers:delivery"
    body = b"d" * args.bytes
    primary.delete(key)
    # Readers start after this entry: an XREAD from an explicit id misses nothing, where `$` would
    # miss what was added before the reader's first call.
    start_id = primary.xadd(key, {"b": b"start"})
    began = time.monotonic()
    stop_at = began + args.max_seconds
    sent_at, acked_at = {}, {}
    seen = [{} for _ in ports]
    publishing = threading.Event()
    publishing.set()
    done_at = [float("inf")]  # when the publisher finished

    def reader(index, port):
        replica = client(port, timeout=10.0)
        last = start_id
        # Bounded: it stops once it saw every event, or when the publisher is done and 5 s have
        # passed, or at the overall deadline.
        while time.monotonic() < stop_at + 5:
            if not publishing.is_set() and (len(seen[index]) >= len(acked_at) or time.monotonic() > done_at[0] + 5):
                break
            reply = replica.xread({key: last}, count=1000, block=100)
            now = time.monotonic()
            for _, entries in reply or []:
                for entry_id, _ in entries:
                    seen[index][entry_id] = now
                    last = entry_id

    readers = [threading.Thread(target=reader, args=(i, port), daemon=True) for i, port in enumerate(ports)]
    for thread in readers:
        thread.start()
    time.sleep(0.2)  # the readers are in XREAD BLOCK
    commands_before = int(primary.info("stats")["total_commands_processed"])
    first = time.monotonic()
    for n in range(args.events):
        due = first + n / args.rate
        now = time.monotonic()
        if now > stop_at:
            break
        if due > now:
            time.sleep(due - now)
        sent = time.monotonic()
        entry_id = primary.xadd(key, {"b": body})
        acked_at[entry_id] = time.monotonic()
        sent_at[entry_id] = sent
    published_for = time.monotonic() - first
    done_at[0] = time.monotonic()
    publishing.clear()
    for thread in readers:
        thread.join(timeout=max(0.0, stop_at + 10 - time.monotonic()))
    commands = int(primary.info("stats")["total_commands_processed"]) - commands_before

    # An event can reach a replica's reader before the publisher's thread has taken the time of
    # the XADD's reply: that sample is 0 (counted in seen_before_ack).
    early = 0
    per_replica = []
    for index in range(len(ports)):
        lags = []
        for entry_id, acked in acked_at.items():
            if entry_id in seen[index]:
                lag = seen[index][entry_id] - acked
                early += lag < 0
                lags.append(max(0.0, lag))
        per_replica.append(sorted(lags))
    to_all = sorted(max(0.0, max(s[e] for s in seen) - acked)
                    for e, acked in acked_at.items() if all(e in s for s in seen))
    round_trips = sorted(acked_at[e] - sent_at[e] for e in acked_at)
    missed = len(acked_at) - len(to_all)
    figures = [f"kind=redis-stream-delivery events={len(acked_at)} missed={missed} replicas={len(ports)}",
               f"rate_target={args.rate:g} rate_per_s={len(acked_at) / published_for:.0f}",
               f"all_p50_ms={ms(quantile(to_all, .5))} all_p99_ms={ms(quantile(to_all, .99))}",
               f"all_max_ms={ms(to_all[-1] if to_all else float('nan'))}"]
    for index, lags in enumerate(per_replica, start=1):
        figures.append(f"replica{index}_p50_ms={ms(quantile(lags, .5))} replica{index}_p99_ms={ms(quantile(lags, .99))}")
    figures += [f"xadd_p50_ms={ms(quantile(round_trips, .5))} xadd_p99_ms={ms(quantile(round_trips, .99))}",
                f"seen_before_ack={early} primary_cmds_per_s_during={commands / published_for:.0f} bytes={args.bytes}"]
    print(" ".join(figures))


def replica_state(replica):
    """(link up?, replica offset or None); (False, None) while it cannot answer."""
    try:
        info = replica.info("replication")
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
        return False, None
    offset = info.get("slave_repl_offset")
    return info.get("master_link_status") == "up", None if offset is None else int(offset)


def catchup(args):
    primary = client(args.primary)
    replica = client(args.replica, timeout=5.0)
    link_up_at = None
    stop_at = time.time() + args.max_seconds
    while time.time() < stop_at:
        target = int(primary.info("replication")["master_repl_offset"])
        up, offset = replica_state(replica)
        now = time.time()
        if up and link_up_at is None:
            link_up_at = now
        if up and offset is not None and offset >= target:
            print(f"kind=redis-return caught_up=yes link_up_s={link_up_at - args.since:.2f} "
                  f"caught_up_s={now - args.since:.2f} offset={offset}")
            return
        time.sleep(0.01)
    print(f"kind=redis-return caught_up=no link_up_s={'-' if link_up_at is None else f'{link_up_at - args.since:.2f}'} "
          f"caught_up_s=- offset={replica_state(replica)[1]}")


def drained(args):
    primary = client(args.primary)
    replicas = [client(int(port), timeout=5.0) for port in args.replicas.split(",")]
    target = int(primary.info("replication")["master_repl_offset"])
    began = time.monotonic()
    while time.monotonic() < began + args.max_seconds:
        states = [replica_state(r) for r in replicas]
        if all(up and offset is not None and offset >= target for up, offset in states):
            print(f"kind=redis-drained drained=yes seconds={time.monotonic() - began:.2f}")
            return
        time.sleep(0.05)
    print(f"kind=redis-drained drained=no seconds={time.monotonic() - began:.2f}")


def counters(args):
    primary = client(args.port)
    stats, replication = primary.info("stats"), primary.info("replication")
    print(f"sync_full={stats['sync_full']} sync_partial_ok={stats['sync_partial_ok']} "
          f"sync_partial_err={stats['sync_partial_err']} offset={replication['master_repl_offset']} "
          f"replicas={replication['connected_slaves']}")


QUEUE_GROUP = "g"


def fresh_group(primary, key):
    """An empty stream KEY with the consumer group QUEUE_GROUP reading it from the start."""
    primary.delete(key)
    primary.xgroup_create(key, QUEUE_GROUP, id="0", mkstream=True)


def group_state(primary, key):
    """`pending=.. undelivered=.. length=..`: taken but not acked, not taken yet, entries kept."""
    pending = primary.xpending(key, QUEUE_GROUP)["pending"]
    groups = primary.xinfo_groups(key)
    lag = groups[0].get("lag") if groups else None
    return f"pending={pending} undelivered={'-' if lag is None else lag} length={primary.xlen(key)}"


def queue(args):
    """PAIRS threads: XADD, then XREADGROUP COUNT 1 BLOCK, then XACK; complete round trips."""
    primary = client(args.primary)
    key = "peers:queue"
    fresh_group(primary, key)
    body = b"q" * args.bytes
    block_ms = int(args.block_seconds * 1000)
    lock = threading.Lock()
    started, errors, empty = [0], [0], [0]
    latencies = [[] for _ in range(args.pairs)]
    began = time.monotonic()
    stop_at = began + args.seconds

    def pair(index):
        conn = client(args.primary, timeout=args.block_seconds + 10)
        consumer, mine = f"c{index}", latencies[index]
        while time.monotonic() < stop_at:
            with lock:
                if started[0] >= args.max_messages:
                    break
                started[0] += 1
            before = time.monotonic()
            try:
                conn.xadd(key, {"b": body})
                reply = conn.xreadgroup(QUEUE_GROUP, consumer, {key: ">"}, count=1, block=block_ms)
                if not reply or not reply[0][1]:
                    with lock:
                        empty[0] += 1  # the BLOCK ran out; another pair takes the entry later
                    continue
                conn.xack(key, QUEUE_GROUP, reply[0][1][0][0])
            except redis.RedisError:  # counted, never retried
                with lock:
                    errors[0] += 1
                continue
            mine.append(time.monotonic() - before)

    threads = [threading.Thread(target=pair, args=(i,), daemon=True) for i in range(args.pairs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, stop_at + args.block_seconds + 15 - time.monotonic()))
    elapsed = time.monotonic() - began
    round_trips = sorted(x for mine in latencies for x in mine)
    print(f"kind=redis-queue pairs={args.pairs} round_trips={len(round_trips)} seconds={elapsed:.2f} "
          f"msgs_per_s={len(round_trips) / elapsed:.0f} {latency_ms(round_trips)} errors={errors[0]} "
          f"empty_reads={empty[0]} {group_state(primary, key)} bytes={args.bytes}")
    primary.delete(key)


def queue_latency(args):
    """A receiver parked in XREADGROUP BLOCK; one XADD at a time; send -> receive."""
    primary = client(args.primary)
    key = "peers:queue-latency"
    fresh_group(primary, key)
    pad = b"l" * args.bytes
    began = time.monotonic()
    stop_at = began + args.max_seconds
    received = threading.Event()
    samples, expired, errors = [], [0], [0]
    finished = threading.Event()

    def receiver():
        conn = client(args.primary, timeout=12.0)
        while not finished.is_set() and time.monotonic() < stop_at and len(samples) < args.samples:
            try:
                reply = conn.xreadgroup(QUEUE_GROUP, "receiver", {key: ">"}, count=1, block=1000)
                now = time.monotonic()
                if not reply or not reply[0][1]:
                    expired[0] += 1  # the BLOCK ran out with nothing sent: park again
                    continue
                entry_id, entry = reply[0][1][0]
                samples.append(now - float(entry[b"t"]))
                conn.xack(key, QUEUE_GROUP, entry_id)
            except redis.RedisError:  # counted; the sender counts the sample as lost
                errors[0] += 1
                continue
            received.set()

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    time.sleep(0.3)  # the receiver is in XREADGROUP BLOCK
    sent = lost = 0
    while sent < args.samples and time.monotonic() < stop_at:
        received.clear()
        primary.xadd(key, {"t": repr(time.monotonic()), "b": pad})
        sent += 1
        if not received.wait(timeout=max(0.0, min(5.0, stop_at - time.monotonic()))):
            lost += 1  # not received within 5 s (or the deadline): no sample
        time.sleep(args.gap_ms / 1000)  # the receiver has acked and is parked again
    finished.set()
    thread.join(timeout=5)
    took = sorted(samples)
    print(f"kind=redis-queue-latency samples={len(took)} sent={sent} lost={lost} {latency_ms(took)} "
          f"gap_ms={args.gap_ms:g} expired_reads={expired[0]} errors={errors[0]} "
          f"seconds={time.monotonic() - began:.2f} {group_state(primary, key)}")
    primary.delete(key)


def queue_drain(args):
    """XADD MESSAGES entries, then one consumer takes and acks them in batches; the seconds."""
    primary = client(args.primary)
    key = "peers:queue-drain"
    fresh_group(primary, key)
    body = b"w" * args.bytes
    began = time.monotonic()
    stop_at = began + args.max_seconds
    added = 0
    while added < args.messages and time.monotonic() < stop_at:
        batch = primary.pipeline(transaction=False)
        count = min(1000, args.messages - added)
        for _ in range(count):
            batch.xadd(key, {"b": body})
        batch.execute()
        added += count
    filled = time.monotonic()
    conn = client(args.primary, timeout=10.0)
    drained = reads = 0
    while drained < added and time.monotonic() < stop_at:
        reply = conn.xreadgroup(QUEUE_GROUP, "drainer", {key: ">"}, count=args.batch, block=1000)
        reads += 1
        if not reply or not reply[0][1]:
            break  # nothing left to take (or the BLOCK ran out): stop
        ids = [entry_id for entry_id, _ in reply[0][1]]
        conn.xack(key, QUEUE_GROUP, *ids)
        drained += len(ids)
    took = time.monotonic() - filled
    print(f"kind=redis-queue-drain messages={added} drained={drained} seconds={took:.3f} "
          f"msgs_per_s={drained / took:.0f} batch={args.batch} reads={reads} fill_seconds={filled - began:.2f} "
          f"{group_state(primary, key)} bytes={args.bytes}")
    primary.delete(key)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("lag")
    one.add_argument("--primary", type=int, required=True)
    one.add_argument("--replica", type=int, required=True)
    one.add_argument("--writes", type=int, default=1000)
    one.add_argument("--max-seconds", type=float, default=90)
    one.set_defaults(run=lag)
    one = commands.add_parser("fill")
    one.add_argument("--port", type=int, required=True)
    one.add_argument("--records", type=int, default=100_000)
    one.add_argument("--bytes", type=int, default=200)
    one.add_argument("--batch", type=int, default=500)
    one.add_argument("--max-seconds", type=float, default=180)
    one.add_argument("--key", default="peers:stream")
    one.add_argument("--sequential-ids", action="store_true")
    one.set_defaults(run=fill)
    one = commands.add_parser("delivery")
    one.add_argument("--primary", type=int, required=True)
    one.add_argument("--replicas", required=True)
    one.add_argument("--events", type=int, default=2000)
    one.add_argument("--rate", type=float, default=200)
    one.add_argument("--bytes", type=int, default=100)
    one.add_argument("--max-seconds", type=float, default=60)
    one.set_defaults(run=delivery)
    one = commands.add_parser("catchup")
    one.add_argument("--primary", type=int, required=True)
    one.add_argument("--replica", type=int, required=True)
    one.add_argument("--since", type=float, required=True)
    one.add_argument("--max-seconds", type=float, default=300)
    one.set_defaults(run=catchup)
    one = commands.add_parser("drained")
    one.add_argument("--primary", type=int, required=True)
    one.add_argument("--replicas", required=True)
    one.add_argument("--max-seconds", type=float, default=120)
    one.set_defaults(run=drained)
    one = commands.add_parser("counters")
    one.add_argument("--port", type=int, required=True)
    one.set_defaults(run=counters)
    one = commands.add_parser("queue")
    one.add_argument("--primary", type=int, required=True)
    one.add_argument("--pairs", type=int, default=1)
    one.add_argument("--seconds", type=float, default=8)
    one.add_argument("--max-messages", type=int, default=500_000)
    one.add_argument("--bytes", type=int, default=100)
    one.add_argument("--block-seconds", type=float, default=5)
    one.set_defaults(run=queue)
    one = commands.add_parser("queue-latency")
    one.add_argument("--primary", type=int, required=True)
    one.add_argument("--samples", type=int, default=300)
    one.add_argument("--gap-ms", type=float, default=10)
    one.add_argument("--bytes", type=int, default=100)
    one.add_argument("--max-seconds", type=float, default=40)
    one.set_defaults(run=queue_latency)
    one = commands.add_parser("queue-drain")
    one.add_argument("--primary", type=int, required=True)
    one.add_argument("--messages", type=int, default=10_000)
    one.add_argument("--batch", type=int, default=1000)
    one.add_argument("--bytes", type=int, default=100)
    one.add_argument("--max-seconds", type=float, default=60)
    one.set_defaults(run=queue_drain)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
