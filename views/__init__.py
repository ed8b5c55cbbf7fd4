"""Views in Redis: one module per view (`timeline`, `clicks`, `enrichment`) that turns a join's changes into Redis
operations, applies them with a sink (`sink.Sink`: `write(changes, batch_id)`) and reads them back; the key
layout (`keys`), Redis I/O (`redis_io`, `wire`), the read side of every view (`read`), errors (`errors`)."""

__all__ = ["sink", "keys", "redis_io", "wire", "read", "timeline", "clicks", "enrichment", "errors"]
