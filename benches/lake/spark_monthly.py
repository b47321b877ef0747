"""bench_lake's `spark` mode: one month's aggregation (per origin and
carrier: flights, mean departure delay, miles) by Spark, over the data
files of the snapshot the step pinned (ORCA_SPARK_JOB), written as Parquet
for the step to commit. The month's filter is pushed to the files' row
group statistics, so other months' files are skipped after their footers.

    spark-submit spark_monthly.py <month>
"""
import json
import os
import sys

from pyspark.sql import SparkSession, functions as F

job = json.load(open(os.environ["ORCA_SPARK_JOB"]))
month = sys.argv[1]
spark = SparkSession.builder.getOrCreate()
(spark.read.parquet(*job["inputs"]["bench.raw"]["files"])
    .where(F.col("month") == month)
    .groupBy("month", "origin", "carrier")
    .agg(F.count("*").alias("flights"), F.avg("dep_delay").alias("avg_dep_delay"),
         F.sum("distance").alias("miles"))
    .coalesce(1)
    .write.mode("overwrite").parquet(job["output"]))
spark.stop()
