"""On-demand benchmarks (not collected by pytest). Run: ``python -m benchmarks.run --help``."""
