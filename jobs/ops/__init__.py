"""Operations: `cli` (the `mview` command), `deploy` and `service` (background jobs), `status`, `maintain`,
`metrics` (Prometheus), `ui` and `httpd` (the operations page)."""

__all__ = ["cli", "deploy", "service", "status", "maintain", "metrics", "ui", "httpd"]
