"""Peer workloads for the side-by-side benchmark (benchmarks/peers.py): DBOS, Celery, Procrastinate,
and the weft_django driver. Each ``*_bench`` module is run as its own subprocess by peers.py, from the
bench venv (.venv-bench), and writes one JSON result file."""
