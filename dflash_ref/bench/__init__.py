"""Benchmarks as side-by-side ratios: the benchmarks (suite.py, trained.py), timing and the
interleaved harness (timing.py), and the full-size smoke check (smoke.py); the command that runs and
reports them is cli/bench.py. Results and what they mean: figures/bench/README.md."""
