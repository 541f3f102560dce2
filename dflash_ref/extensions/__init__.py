"""Extensions: options neither the paper nor the official code has, each off unless asked for and
each lossless: a draft vocabulary (draft_vocab.py), a confidence-gated verify (verify_gate.py), and
the CPU's faster product for decoding's few rows (linear.py: the kernel measured fastest,
linear_plan.py, among torch's and a C product, streamed.py)."""
