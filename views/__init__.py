"""Views in Redis: key layout, sinks that apply micro-batches idempotently, generations, the read side."""

__all__ = ["keys", "redis_io", "read", "timeline", "errors"]
