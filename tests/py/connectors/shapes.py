"""A connector whose discover lists the streams (with their columns) of the
JSON file its config's "shape" names, for the drift test
(tests/tests/connectors.rs): a test rewrites the file between attempts to
change what the source looks like. Each stream reads three records."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "connectors", "python"))
from orca_connector import Source, run  # noqa: E402


class Shapes(Source):
    name = "shapes"
    replay = "exact"

    def discover(self, config):
        with open(config["shape"]) as f:
            return json.load(f)["streams"]

    def read(self, config, stream, after):
        start = int(after[0]) + 1 if after else 1
        for i in range(start, 4):
            yield {"id": i, "stream": stream["name"]}, [str(i)]


run(Shapes())
