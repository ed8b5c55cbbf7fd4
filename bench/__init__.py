"""The benchmarks (`make bench`, `python -m bench`): the timeline job's throughput, replay, incrementality and
freshness against references measured in the same run (`bench.timeline`, `bench.freshness`), the clicks and
enrichment jobs' benches (`bench.clicks`, `bench.enrichment`), the report that writes bench/results.json, the
table of docs/bench.md, the README's summary and docs/bench.png (`bench.report`), and the deployed-job trigger
probe (`bench.trigger_probe`)."""

__all__: list[str] = []
