"""The Spark application of the probe_spark pipeline's `totals` step: the
flights and total delay per carrier of one month, read from the data files
of the snapshot the step pinned (its job file, ORCA_SPARK_JOB) and written
as Parquet into the job's output directory, for the step to commit.

    spark-submit spark_totals.py <month>

PROBE_SPARK_FAIL=1 makes it fail (a task raises); PROBE_SPARK_SLEEP=N makes
each task sleep N seconds first (for the cancel test).
"""
import json
import os
import sys
import time

from pyspark.sql import SparkSession, functions as F

job = json.load(open(os.environ["ORCA_SPARK_JOB"]))
month = sys.argv[1]
files = job["inputs"]["spark.events"]["files"]
spark = SparkSession.builder.getOrCreate()
print(f"probe: {len(files)} files of snapshot {job['inputs']['spark.events']['snapshot']}")

if os.environ.get("PROBE_SPARK_SLEEP"):
    pause = int(os.environ["PROBE_SPARK_SLEEP"])
    spark.sparkContext.parallelize(range(2), 2).foreach(lambda _: time.sleep(pause))
if os.environ.get("PROBE_SPARK_FAIL"):
    def fail(_):
        raise RuntimeError("probe: the Spark job was asked to fail")
    spark.sparkContext.parallelize(range(2), 2).foreach(fail)

(spark.read.parquet(*files)
    .where(F.col("month") == month)
    .groupBy("month", "carrier")
    .agg(F.count("*").alias("flights"), F.sum("delay").alias("delay"))
    .coalesce(1)
    .write.mode("overwrite").parquet(job["output"]))
print(f"probe: totals of {month} written")
spark.stop()
