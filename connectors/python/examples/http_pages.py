"""An HTTP API source that reads pages through the host's HTTP service.

Each stream's config names a ``path`` under the source's ``base_url``; the
API answers ``GET {base_url}{path}?page=N`` with ``{"items": [...],
"next": URL or null}`` and page N always holds the same items, so the resume
point (the page and the index of the last item read on it) makes ``replay``
``exact``. Requests go through the host (``HostHTTP``): netguard checks the
address of every page, the ``next`` links the API hands out included, and
the host retries 429 and 5xx answers.

    {"type": "connector", "connector": "http_pages", "replay": "exact",
     "config": {"base_url": "http://api.internal:8080"}}
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from orca_connector import ConnectorError, HostHTTP, Source, run  # noqa: E402


class HttpPages(Source):
    name = "http_pages"
    replay = "exact"
    reaches = ["base_url"]

    def discover(self, config):
        return [{"name": "items", "config": {"path": "/items"}}]

    def read(self, config, stream, after):
        base = config.get("base_url", "").rstrip("/")
        path = stream["config"].get("path")
        if not base or not path:
            raise ConnectorError("config.base_url and the stream's config.path are required")
        http = HostHTTP()
        page, done = (int(after[0]), int(after[1])) if after else (1, -1)
        url = f"{base}{path}?page={page}"
        while url:
            body = http.get_json(url)
            items = body.get("items") or []
            for i, item in enumerate(items):
                if i > done:
                    yield item, [str(page), str(i)]
            if not items:
                return
            url, page, done = body.get("next"), page + 1, -1


if __name__ == "__main__":
    run(HttpPages())
