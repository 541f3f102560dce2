"""The Port contract: what every adapter of the kit is, and the bookkeeping every adapter's run() shares.

A port runs one implementation of DFlash on a golden bundle and hands back what it computed, keyed as the
bundle's manifest lists it. Writing one is the contract below plus the taps of its framework (`ports/torch_taps.py`,
`ports/mlx_taps.py`):

    class MyPort(Port):
        name = "my-port"
        variants = {"draft_cache": "context-only"}   # its design, declared (variants.py)
        package = "my_package"                       # a crash is located at this package's innermost frame

        def run(self, bundle) -> dict[str, array]:
            # load bundle.target_dir / bundle.draft_dir (Hugging Face folders), decode bundle.inputs greedily
            # (input_ids, max_new_tokens, stop_token_ids, block_size) and return what you computed, keyed as
            # bundle.entries list them (stages.key_for builds keys), batch dimension dropped
            out = {...}
            return outputs(out, bundle.inputs["input_ids"], tokens, layer_ids)

Every capability a port may have is an attribute here with its default, so the kit reads `port.skip`, never
`getattr(port, "skip", ())`. An object that is not a Port but has `run()` (or a bare run function) is taken as
one by `as_port`, its attributes read once, there. numpy only: the MLX ports use it without torch.
"""

from __future__ import annotations

import importlib.metadata
from typing import ClassVar

import numpy as np

from .stages import key_for


class Port:
    """One implementation of DFlash as the kit runs it: `run(bundle)` → {manifest key: array}."""

    name: str = "port"
    # its design variants, declared (variants.VARIANTS: name → value); the rest the kit detects
    variants: ClassVar[dict[str, str]] = {}
    # stages it computes only inside fused kernels, never as a tensor: waived, and said as waived
    skip: tuple[str, ...] = ()
    # False: it reads DFlash checkpoints only, so a bundle whose draft is a Muse Glimmer folder is n/a
    reads_muse: bool = True
    # True: an engine, which takes the engine-shaped bundles only (verify --sampling writes ENGINE_SAMPLING)
    engine_shaped: bool = False
    # the package (or packages) whose innermost frame a crash is located at (crash.py)
    package: str | tuple[str, ...] = ()
    # which code of the port it found, known after a run (the official code's "0.1.0" or "github")
    layout: str | None = None
    # which release of the port ran (a library the user upgrades: its bugs come and go with it)
    version: str | None = None

    def run(self, bundle) -> dict:
        raise NotImplementedError(f"{type(self).__name__} is a Port without run(bundle)")

    def sampler(self, bundle, verifier: str):
        """`verify --sampling`: a sampler, seed → (output ids, first step's τ). A greedy port has none."""
        raise ValueError(
            f"{self.name!r} has no sampler(bundle, verifier): a greedy adapter cannot be checked by its distribution"
        )

    @property
    def label(self) -> str:
        """The port as its report names it: its name, the code it found, the release that ran."""
        return " ".join(
            [self.name] + ([f"[{self.layout} code]"] if self.layout else []) + ([self.version] if self.version else [])
        )

    @staticmethod
    def release(distribution: str) -> str | None:
        """The installed release of a distribution (for `version`), None where it is not installed."""
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return None


class _Given(Port):
    """An object with run() that is not a Port (a port written before the contract, or a user's), read as one:
    each capability its own attribute where it has it, read when asked (a layout is known after a run)."""

    def __init__(self, given) -> None:
        self.given = given
        self.name = getattr(given, "name", None) or getattr(given, "__name__", None) or type(given).__name__

    def run(self, bundle) -> dict:
        if not hasattr(self.given, "run"):
            return super().run(bundle)
        return self.given.run(bundle)

    def sampler(self, bundle, verifier: str):
        if hasattr(self.given, "sampler"):
            return self.given.sampler(bundle, verifier)
        return super().sampler(bundle, verifier)

    def __getattribute__(self, attr: str):
        if attr in ("variants", "skip", "reads_muse", "engine_shaped", "package", "layout", "version"):
            return getattr(object.__getattribute__(self, "given"), attr, getattr(Port, attr))
        return object.__getattribute__(self, attr)


class _Function(Port):
    """A bare run function as a port, named after it."""

    def __init__(self, run) -> None:
        self._run, self.name = run, getattr(run, "__name__", "function")

    def run(self, bundle) -> dict:
        return self._run(bundle)


def as_port(impl) -> Port:
    """A Port as it is; an object with run() or sampler() (a sampling-only port) as a Port; a function bundle → dict
    as one; else a TypeError."""
    if isinstance(impl, Port):
        return impl
    if hasattr(impl, "run") or hasattr(impl, "sampler"):
        return _Given(impl)
    if callable(impl):
        return _Function(impl)
    raise TypeError(f"{impl!r} is not a port: a Port, an object with run(bundle) or sampler(), or a function")


def outputs(out: dict, prompt, tokens, layer_ids=None, first_token=None) -> dict:
    """The loop's outcome as every port records it, into `out`: output_ids (the prompt, then every token the port
    produced), first_token (x_0: `first_token`, the one the port's loop committed after its prefill, where the
    adapter read it; else the first token produced, where there is one: a port that filters its output after the
    loop would then show its output's bug as a wrong x_0) and, where given, layer_ids (the target layers its draft
    reads, as DFlash numbers them). Returns `out`."""
    tokens = [int(t) for t in tokens]
    out[key_for("output_ids")] = np.asarray([int(t) for t in prompt] + tokens, np.int64)
    if first_token is not None or tokens:
        out[key_for("first_token")] = np.asarray(int(tokens[0] if first_token is None else first_token), np.int64)
    if layer_ids is not None:
        out[key_for("layer_ids")] = np.asarray(layer_ids, np.int64)
    return out


def loop_values(out: dict, step: int, draft_tokens, posterior, tau, bonus, cache_lengths) -> None:
    """One step's loop values into `out`: its proposals (where it drafted), posterior, τ, bonus and the six cache
    lengths (draft before, after its pass, after the crop; target the same)."""
    if len(draft_tokens):
        out[f"step{step}/draft_tokens"] = np.asarray(draft_tokens, np.int64)
    out[f"step{step}/posterior"] = np.asarray(posterior, np.int64)
    out[f"step{step}/acceptance_length"] = np.asarray(tau, np.int64)
    out[f"step{step}/bonus"] = np.asarray(bonus, np.int64)
    out[f"step{step}/cache_lengths"] = np.asarray(cache_lengths, np.int64)


def pair_scores(predecessors: list, projected: np.ndarray, successors: list) -> np.ndarray:
    """A port's pair term from its own intermediates, one position at a time: E_pred(x_{t−1}) (r,) per t,
    P h (γ, r), E_succ(c_t) (K, r) per t → ⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,k})⟩ (γ, K), in float64."""
    return np.stack(
        [
            np.asarray(s, np.float64) @ (np.asarray(e, np.float64) * projected[t])
            for t, (e, s) in enumerate(zip(predecessors, successors))
        ]
    )


def check_path(port: str, path: np.ndarray, candidates: np.ndarray, scores: np.ndarray) -> None:
    """Greedy: the port's path (γ,) is the argmax of the scores (γ, K) it was re-derived with, else the
    recorded pair scores are not the ones it used (an AssertionError, as for re-derived attention weights)."""
    chosen = np.take_along_axis(candidates, scores.argmax(-1)[:, None], axis=-1)[:, 0]
    if not np.array_equal(chosen, path):
        raise AssertionError(
            f"{port}: the re-derived selector scores do not reproduce its path ({chosen.tolist()} vs {path.tolist()})"
        )
