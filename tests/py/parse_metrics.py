"""Reads Prometheus' text exposition format from stdin with prometheus_client's
own parser and prints the samples as JSON lines: {"name", "labels", "value", "type"}.
A text the parser refuses exits non-zero with its error."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        print(json.dumps({"name": sample.name, "labels": sample.labels,
                          "value": sample.value, "type": family.type}))
