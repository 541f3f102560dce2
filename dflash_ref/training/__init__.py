"""Training a draft: the paper's recipe (recipe.py), the prompts (prompts.py, or one's own:
prompt_file.py), self-distilled data (distill.py), the command's options (options.py), a resumable
checkpoint (state.py), and measuring acceptance (measure.py, teacher_forced.py)."""
