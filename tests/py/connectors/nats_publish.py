"""Makes a JetStream stream (if missing) and publishes messages to it.

  nats_publish.py STREAM FIRST COUNT
Publishes {"id": i, "amount": i % 1000, "note": ...} for i in FIRST..FIRST+COUNT-1
to subject STREAM.orders; prints {"last_seq": N}. Each message carries its id
as its Nats-Msg-Id, so that a batch published again after a failure part way
is stored once (JetStream's duplicate window). `nats_publish.py STREAM
--delete` removes the stream.
"""
import asyncio
import json
import sys

import nats
from nats.js.api import StreamConfig


async def main():
    name = sys.argv[1]
    nc = await nats.connect("nats://127.0.0.1:4222")
    js = nc.jetstream()
    if sys.argv[2] == "--delete":
        try:
            await js.delete_stream(name)
        except Exception:
            pass
        await nc.close()
        return
    first, count = int(sys.argv[2]), int(sys.argv[3])
    try:
        await js.stream_info(name)
    except Exception:
        await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"]))
    last = 0
    for i in range(first, first + count):
        note = None if i % 10 == 0 else f"order {i}"
        ack = await js.publish(f"{name}.orders",
                               json.dumps({"id": i, "amount": i % 1000, "note": note}).encode(),
                               headers={"Nats-Msg-Id": str(i)})
        last = ack.seq
    await nc.close()
    print(json.dumps({"last_seq": last}))


asyncio.run(main())
