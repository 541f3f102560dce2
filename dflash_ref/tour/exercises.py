"""Predict, then run: a notebook's exercise states a question, the learner sets a variable to a prediction,
and a cell runs the library and holds the prediction to what it did."""

from __future__ import annotations


def check(prediction, actual, why: str) -> bool:
    """None: nothing predicted yet (said, the answer kept back). Else the prediction must equal what the run
    gave: an AssertionError that says both and why, or a line that says it was right. → whether it was."""
    if prediction is None:
        print("Predict first: set the variable above to your answer, then run this cell again.")
        return False
    if prediction != actual:
        raise AssertionError(f"not quite: you predicted {prediction!r}, the run gave {actual!r}. {why}")
    print(f"right: {actual!r}. {why}")
    return True
