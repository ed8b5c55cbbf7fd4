"""The skeleton every job shares and what it runs on: `settings` (the one settings object), `spark` (the
SparkSession), `runtime` (paths, the status file, the streaming query), `skeleton` (one micro-batch at a time),
`registry` (the jobs of the pipeline), `generations` and `replay` (blue/green rebuilds), `lake`, `phases`,
`source` (a source job's loop) and `submit` (the spark-submit entry point)."""

__all__ = [
    "settings",
    "spark",
    "runtime",
    "skeleton",
    "registry",
    "generations",
    "replay",
    "lake",
    "phases",
    "source",
    "submit",
]
