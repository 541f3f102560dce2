"""Benchmarks as side-by-side ratios: against transformers' own generate and forward (baselines.py:
baselines, dflash2; steps.py: an AR step, a verify and a draft pass by linear plan), the other
benchmarks (suite.py, trained.py), timing and the interleaved harness (timing.py), and the full-size
smoke check (smoke.py); the command that runs and reports them is cli/bench.py. What each measures and how
to read it: figures/bench/README.md; the latest results: figures/bench/bench.md."""
