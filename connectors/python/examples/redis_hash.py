"""A Redis destination connector: a stream written with ``merge`` keeps one
hash per key (``{prefix}{stream}:{key}``, a delete marker removes it), one
written with ``append`` a list of JSON rows (``{prefix}{stream}``).

Each commit is one MULTI/EXEC that also sets the stream's marker
(``{prefix}_orca:marker:{stream}``), WATCHing the fence and the marker, so
an epoch's rows and its marker become visible together and a commit of an
older generation or of an epoch already in changes nothing: ``commits`` is
``atomic``, and a sync from an exact source is exactly once.

    {"type": "connector", "connector": "redis_hash", "commits": "atomic",
     "config": {"url": "redis://127.0.0.1:6379/0", "prefix": "shop:"}}
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import redis  # noqa: E402

from orca_connector import ConnectorError, Destination, Fenced, run  # noqa: E402

# Columns of the engine's own, kept out of the rows written.
INTERNAL = ("_orca_id", "_orca_epoch", "_orca_deleted", "_orca_lsn")


class RedisHash(Destination):
    name = "redis_hash"
    commits = "atomic"
    modes = ["append", "merge"]
    reaches = ["url"]

    def open(self, config, streams):
        url = config.get("url")
        if not url:
            raise ConnectorError("config.url is required: redis://host:port/db")
        self.prefix = config.get("prefix", "")
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.r.ping()
        self.keys = {s["name"]: s.get("primary_key") or [] for s in streams}

    def _fence_key(self):
        return f"{self.prefix}_orca:fence"

    def _marker_key(self, stream):
        return f"{self.prefix}_orca:marker:{stream}"

    def fence(self, generation):
        with self.r.pipeline() as p:
            while True:
                try:
                    p.watch(self._fence_key())
                    fence = int(p.get(self._fence_key()) or 0)
                    if fence > generation:
                        return fence
                    p.multi()
                    p.set(self._fence_key(), generation)
                    p.execute()
                    return generation
                except redis.WatchError:
                    continue

    def marker(self, stream):
        return int(self.r.get(self._marker_key(stream)) or 0)

    def commit(self, stream, epoch, generation, rows, mode):
        records = rows.to_pylist() if rows.num_columns else []
        key_cols = self.keys.get(stream, [])
        with self.r.pipeline() as p:
            while True:
                try:
                    p.watch(self._fence_key(), self._marker_key(stream))
                    fence = int(p.get(self._fence_key()) or 0)
                    if fence > generation:
                        raise Fenced(fence)
                    if int(p.get(self._marker_key(stream)) or 0) >= epoch:
                        return
                    p.multi()
                    for rec in records:
                        data = {k: v for k, v in rec.items() if k not in INTERNAL}
                        if mode == "merge":
                            key = f"{self.prefix}{stream}:" + ":".join(
                                str(rec.get(k)) for k in key_cols)
                            p.delete(key)
                            if not rec.get("_orca_deleted"):
                                fields = {k: v if isinstance(v, str) else json.dumps(v, default=str)
                                          for k, v in data.items() if v is not None}
                                if fields:
                                    p.hset(key, mapping=fields)
                        else:
                            p.rpush(f"{self.prefix}{stream}", json.dumps(data, default=str))
                    p.set(self._marker_key(stream), epoch)
                    p.execute()
                    return
                except redis.WatchError:
                    continue


if __name__ == "__main__":
    run(RedisHash())
