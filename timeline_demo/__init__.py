"""The demo: workload generators, brute-force references, the end-to-end demo and its live web page. The
benchmarks are the package `bench`."""

__all__: list[str] = []
