"""The PyPI ports of DFlash as ports of the kit: one adapter per package, each reading the port's own tensors
(taps on its modules, its loop's own variables), never recomputing them. The ports run in an environment of their
own (.ci/ports); a port that is not installed is n/a with the line that installs it."""
