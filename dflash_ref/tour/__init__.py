"""The tour: the code of the main job (`python -m dflash_ref walkthrough`), the seed's example on tiny
models (demo.py) told step by step with its figures (story.py), and of the notebooks built from the
repository's walkthroughs/*.py (notebooks.py), whose helpers it holds."""
