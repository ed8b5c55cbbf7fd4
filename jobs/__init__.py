"""Jobs and operations.

Wiring, one module per job on one skeleton (`skeleton.run_job`): `timeline`, `clicks`, `enrichment`, listed in
`registry`. Operations: `cli` (the `mview` command), `deploy` and `service` (background jobs), `replay` and
`generations` (rebuilds and the generation pointer), `status`, `maintain`, `submit` (spark-submit entry point).
Shared: `settings` (the one settings object), `spark` (the SparkSession), `runtime` (paths, status file, the
streaming query), `phases` (where a batch's time goes, for its log line), `errors`.
"""

__all__ = [
    "skeleton",
    "timeline",
    "clicks",
    "enrichment",
    "registry",
    "cli",
    "deploy",
    "service",
    "replay",
    "generations",
    "status",
    "maintain",
    "submit",
    "settings",
    "spark",
    "runtime",
    "phases",
    "errors",
]
