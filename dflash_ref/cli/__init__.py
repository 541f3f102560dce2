"""The command line's commands, one module each (generate, train, evaluate, bench), and the output
folders they are given (folders.py); the parser and the dispatch are in __main__.py."""
