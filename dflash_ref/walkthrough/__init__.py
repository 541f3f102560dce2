"""The walkthrough, the main job (`python -m dflash_ref walkthrough`): the seed's example on tiny
models (demo.py), told step by step with its figures (story.py), and the notebooks built from
walkthroughs/*.py (notebooks.py)."""
