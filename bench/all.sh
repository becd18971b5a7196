#!/bin/sh
# Rerun everything docs/benchmarks.md reports and print it beside the documented figures (bench/all.py).
cd "$(dirname "$0")/.." && exec python3 bench/all.py "$@"
