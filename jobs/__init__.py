"""Jobs and operations, the only layer that knows changelog, joins and views together.

`core` (the skeleton every job shares, settings, the registry of the pipeline's jobs, generations, replay), `kinds`
(a runner per join kind, `interval`, `asof`, `join`, and the source jobs `kafka` and `cdc`), `ops` (the `mview`
command, deploy, service, status, maintenance, metrics, the operations page) and `dev` (development servers and the
JVM cache; no other module imports it). `errors` is the layer's error root.
"""

__all__ = ["core", "kinds", "ops", "dev", "errors"]
