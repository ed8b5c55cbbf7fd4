"""Per-topic ingest hooks (e.g. the profiles table applies its changes after each append). Imported by ingest."""

from __future__ import annotations

__all__: list[str] = []
