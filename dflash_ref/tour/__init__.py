"""The tour: what the walkthrough notebooks (the repository's walkthroughs/*.py) stand on, and the runner
that is the main job (`python -m dflash_ref walkthrough`, notebooks.py): the toy models (demo.py) and
the toy drafts trained for them (toy_drafts.py), the library's code shown beside a recomputation
(source.py), the exercises' check (exercises.py), and the SmolLM2 runs of notebooks 02 and 04."""
