"""The timeline demo: workload generator, brute-force reference, end-to-end demo and benchmarks."""

__all__: list[str] = []
