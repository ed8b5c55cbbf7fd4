"""A job runner per join kind: `interval`, `asof` (`run(spark, settings, pipeline, job, ...)`), wiring a pipeline's job
(`spec.model.Job`) on the skeleton (`jobs.skeleton.run_job`): its join (`joins`), its state, and its views
(`views.row`, `views.count`, `views.log`, through `views.frame`). Nothing here knows a topic, a field or a view
by name: every name comes from the pipeline."""

__all__ = ["interval", "asof"]
