#!/usr/bin/env python3
"""An Orca source connector for NATS JetStream streams.

Each Orca stream reads one JetStream stream (``{"stream": "ORDERS"}`` in the
stream's config, and optionally ``"subject": "orders.eu.>"`` to filter it),
from the message after its resume point up to the stream's last message
when the read began. The resume point is the stream sequence of the last
message read, so a read again from it returns the same messages in the same
order: the connector is exact, and a sync through it into Postgres or
Iceberg lands each message once.

A record is the message's JSON object (a payload that is not a JSON object
becomes ``{"data": <text>}``) with ``nats_seq`` and ``nats_subject`` added.
If the stream's retention removed messages after the resume point before
they were read, the read fails and says which: nothing is skipped silently.

Config: ``{"servers": "nats://127.0.0.1:4222"}`` (a list or a comma-separated
string; ``user``/``password`` may be given as secrets).
"""
import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import nats  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: E402
from nats.errors import TimeoutError as NatsTimeout  # noqa: E402

from orca_connector import ConnectorError, Source, run  # noqa: E402

FETCH = 500


def _servers(config):
    s = config.get("servers") or "nats://127.0.0.1:4222"
    return [x.strip() for x in s.split(",")] if isinstance(s, str) else list(s)


class JetStream(Source):
    name = "nats_jetstream"
    replay = "exact"
    reaches = ["servers"]

    def __init__(self):
        self.loop = asyncio.new_event_loop()

    def _connect(self, config):
        opts = {"servers": _servers(config), "connect_timeout": 5, "max_reconnect_attempts": 2}
        if config.get("user"):
            opts["user"] = config["user"]
            opts["password"] = config.get("password")
        try:
            return self.loop.run_until_complete(nats.connect(**opts))
        except Exception as e:
            raise ConnectorError(f"cannot connect to {opts['servers']}: {e}") from e

    def discover(self, config):
        nc = self._connect(config)
        try:
            js = nc.jetstream()
            streams = self.loop.run_until_complete(js.streams_info())
            return [{"name": s.config.name.lower().replace("-", "_"),
                     "config": {"stream": s.config.name},
                     "subjects": s.config.subjects,
                     # rows_estimate: what a catalog may see change
                     # without a new version (orca.store_catalog).
                     "rows_estimate": s.state.messages} for s in streams]
        finally:
            self.loop.run_until_complete(nc.close())

    def read(self, config, stream, after):
        name = stream["config"].get("stream")
        if not name:
            raise ConnectorError(f"stream {stream['name']}: its config names no JetStream "
                                 "stream ({\"stream\": \"ORDERS\"})")
        subject = stream["config"].get("subject")
        nc = self._connect(config)
        try:
            js = nc.jetstream()
            try:
                info = self.loop.run_until_complete(js.stream_info(name))
            except Exception as e:
                raise ConnectorError(f"JetStream stream {name}: {e}") from e
            start = int(after[0]) + 1 if after else 1
            first, last = info.state.first_seq, info.state.last_seq
            if after and first > start and last >= start:
                raise ConnectorError(
                    f"JetStream stream {name}: messages {start}..{first - 1} were removed by "
                    f"its retention before this sync read them (it resumes after {after[0]})")
            if last < start or info.state.messages == 0:
                return
            cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                 opt_start_seq=start, ack_policy=AckPolicy.NONE,
                                 filter_subject=subject, inactive_threshold=60.0)
            sub = self.loop.run_until_complete(
                js.pull_subscribe(subject or ">", durable=None, stream=name, config=cfg))
            seq = start - 1
            while seq < last:
                try:
                    msgs = self.loop.run_until_complete(sub.fetch(FETCH, timeout=2))
                except NatsTimeout:
                    break  # nothing more matches the filter up to the end
                for m in msgs:
                    seq = m.metadata.sequence.stream
                    if seq > last:
                        break
                    try:
                        record = json.loads(m.data)
                    except ValueError:
                        record = None
                    if not isinstance(record, dict):
                        record = {"data": m.data.decode("utf-8", "replace")}
                    record["nats_seq"] = seq
                    record["nats_subject"] = m.subject
                    yield record, [str(seq)]
            self.loop.run_until_complete(sub.unsubscribe())
        finally:
            self.loop.run_until_complete(nc.close())


if __name__ == "__main__":
    run(JetStream())
