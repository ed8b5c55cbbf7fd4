"""A job runner per join kind: `interval`, `asof`, `join` (`run(spark, settings, pipeline, job, ...)`), wiring a pipeline's job
(`spec.model.Job`) on the skeleton (`jobs.core.skeleton.run_job`): its join (`joins`), its state, and its views
(`views.row`, `views.count`, `views.log`, through `views.frame`). Nothing here knows a topic, a field or a view
by name: every name comes from the pipeline. The source jobs `kafka` and `cdc` copy Kafka topics and captured
PostgreSQL tables into the pipeline's topic logs."""

__all__ = ["interval", "asof", "join", "kafka", "cdc"]
