"""Benchmark suites and the runner behind `jaxrw bench` (see bench/README.md).

case.py (the case registry and random inputs), algebra/merge/models/streams.py (the suites;
nets.py and resnet.py hold the model code), timing.py (how times are taken), runner.py (runs
cases, float64 checks, JSON records), report.py (table and plot), summarize.py (markdown).
Also here: costcheck.py (cost-model validation pairs) and the differential fuzzer (fuzz*.py).
"""
