"""Entry points: jobs wiring sources, joins and views; the `mview` CLI; deploy, status, replay."""

__all__ = ["cli", "registry", "settings", "spark"]
