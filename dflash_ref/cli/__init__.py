"""The command line's commands, one module each, thin over the packages they drive: generate, train, evaluate,
bench, smoke, walkthrough, view, golden, verify and matrix; and the output folders they are given (folders.py).
The parser and the dispatch are in __main__.py."""
