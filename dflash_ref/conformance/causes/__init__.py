"""Causes for a port's divergence found by testing hypotheses: a catalogue of mis-implementations, each the
reference with one stage changed (catalogue.py), and the diagnosis that runs them on a failing bundle and names
those that reproduce the port's tensors (diagnose.py). Imports torch: the runner calls it, never the judge."""
