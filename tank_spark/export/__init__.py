"""The Delta export job (`tank_spark.export.job`), split by concern: plan, schema, rows, files, commit."""
