"""Drafts: random ones sized to a target (random_draft.py), the oracle that proposes a known
continuation (oracle.py), a draft started from its target's own layers (from_target.py), the
official folder format (checkpoint.py), opening a `--draft` folder and the draft shipped for SmolLM2
(folder.py; its weights in smollm2/)."""
