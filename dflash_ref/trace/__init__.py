"""A trace of a whole decoding run: every hook point's tensor per step, plus the StepRecord of each
step (positions, block, draft tokens, posterior, τ, bonus, cache lengths around each crop). The trace
observes the loop from outside: its hooks read the models' hook points, and its `on_step` builds each
record from the Step the loop hands its observers; `plots.py` draws figures from it, viewer/ a page.

Modelled on TransformerLens's ActivationCache: look-up by hook name (`trace[name]` → one tensor per
step, `trace[name, step]` → one tensor), `keys()`, a readable repr, `save` / `load` (safetensors +
JSON, no pickle; a round trip is bit-identical). Tensors are stored without the batch dimension
(the loop decodes one sequence), e.g. a draft attention pattern is (H_q, L_q, L_k) with
L_k = draft_cache_before + ctx_len + L_q: the first `context_columns(step)` columns are context keys,
the last L_q the block's.

    with tracing(draft, target, names=["*hook_pattern"]) as trace:
        out = spec_generate(draft, target, ids, 32, on_step=trace.on_step)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from ..decoding import DraftedProposal, Step
from ..hooks import HookPoint, hook_points, hooks
from ..target.checkpoint import save_safetensors
from ..viewer import write_html

FORMAT = "dflash_ref.trace/3"  # /3: StepRecord.lookup (prompt lookup); /2: verify_size
READABLE = ("dflash_ref.trace/1", "dflash_ref.trace/2", FORMAT)  # older ones load with lookup False, verify_size 0


@dataclasses.dataclass
class StepRecord:
    """What happened in one decode step (the trace stores one per step)."""

    step: int
    start: int  # position of x_0, the last committed token
    block_ids: list[int]  # [x_0, d_1, …] as verified (drafted from [x_0, mask, …])
    q_position_ids: list[int]  # positions of the draft's block (Q): start … start + L_q − 1
    k_position_ids: list[int]  # every key column of the draft's attention: cached context,
    # new context, block = 0 … start + L_q − 1
    draft_tokens: list[int]  # d_1..d_γ, every proposal drafted
    posterior: list[int]  # the target's token at each block position (empty: rejection)
    acceptance_length: int  # τ, accepted draft tokens
    bonus: int  # the target's token after the accepted run
    produced: int  # tokens committed (τ + 1, clipped by max length or a stop token)
    ctx_len: int  # L_c, new context features fed to this draft pass
    draft_cache_before: int
    draft_cache_after_draft: int  # before its crop
    draft_cache_after: int  # after its crop (= start)
    target_cache_before: int
    target_cache_after_verify: int  # before its crop
    target_cache_after: int  # after its crop (= new start)
    verify_size: int = 0  # L, tokens verified: L_q, or 2 where verify_gate shut (0: not recorded,
    # a trace saved before this field existed)
    lookup: bool = False  # d_1..d_γ copied by prompt lookup (extensions/prompt_lookup.py): no
    # draft pass, so no draft positions and no draft activations this step

    @classmethod
    def of(cls, step: Step) -> StepRecord:
        """The record of one step, from what its stages left (`Step`), read in the loop's `on_step` (the
        caches as they stand after the crop). The lengths after each crop are read off the caches, the draft
        cache's around its pass off the draft's proposal (no pass: unchanged), the target cache's after the
        verify off the step; before it, the target cache holds every position before x_0 (the previous
        record's `target_cache_after`)."""
        proposal, start, drafted = step.proposal, step.block.start, isinstance(step.proposal, DraftedProposal)
        q_len = proposal.drafted.shape[1] if drafted else int(step.block.size == 1)  # L_q of the draft's block
        draft_after = step.draft_cache.get_seq_length()
        draft_before, draft_after_pass = proposal.cache_lengths if drafted else (draft_after, draft_after)
        verify_size = proposal.block_ids.shape[1]
        return cls(
            step=step.index,
            start=start,
            block_ids=proposal.block_ids[0].tolist(),
            q_position_ids=list(range(start, start + q_len)),
            k_position_ids=list(range(start + q_len)) if q_len > 1 else [],
            draft_tokens=(proposal.drafted if drafted else proposal.block_ids)[0, 1:].tolist(),
            verify_size=verify_size,
            posterior=step.posterior[0].tolist() if step.posterior is not None else [],
            acceptance_length=step.acceptance_length,
            bonus=step.bonus,
            produced=step.produced,
            ctx_len=proposal.context_length if drafted else 0,
            draft_cache_before=draft_before,
            draft_cache_after_draft=draft_after_pass,
            draft_cache_after=draft_after,
            target_cache_before=start,
            target_cache_after_verify=step.verified_length,
            target_cache_after=step.target_cache.get_seq_length(),
            lookup=not drafted and step.block.size > 1,
        )


class StepLog(list):
    """The run's StepRecords, as `spec_generate(..., on_step=log)` makes them (a list, callable)."""

    def __call__(self, step: Step) -> None:
        self.append(StepRecord.of(step))


NameFilter = Iterable[str] | Callable[[str], bool] | None


def _name_filter(names: NameFilter) -> Callable[[str], bool]:
    if names is None:
        return lambda name: True
    if callable(names):
        return names
    patterns = [names] if isinstance(names, str) else list(names)
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


class Trace:
    def __init__(self, meta: dict | None = None) -> None:
        self.meta: dict = meta or {}
        self.records: list[StepRecord] = []
        self.activations: list[dict[str, torch.Tensor]] = []  # per recorded step
        self.prefill: dict[str, torch.Tensor] = {}  # target hooks during the prefill
        self._pending: dict[str, torch.Tensor] = {}

    # -- recording ---------------------------------------------------------------------------
    def on_step(self, step: Step) -> None:
        """Pass as `spec_generate(..., on_step=trace.on_step)`: closes the step's record."""
        self.records.append(StepRecord.of(step))
        self.activations.append(self._pending)
        self._pending = {}

    # -- look-up -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.records)

    def keys(self) -> list[str]:
        names = set(self.prefill)
        for acts in self.activations:
            names |= set(acts)
        return sorted(names)

    def __contains__(self, name: str) -> bool:
        return name in self.keys()

    def __getitem__(self, key):
        """trace[name] → list of tensors (None for steps not recorded); trace[name, step] → tensor."""
        if isinstance(key, tuple):
            name, step = key
            acts = self.activations[step]
            if name not in acts:
                raise KeyError(f"{name!r} was not recorded at step {step}; recorded: {sorted(acts)}")
            return acts[name]
        if key not in self.keys():
            raise KeyError(f"no hook named {key!r} in this trace; known: {self.keys()}")
        return [acts.get(key) for acts in self.activations]

    def attention(self, step: int, layer: int) -> torch.Tensor:
        """Draft layer `layer`'s attention weights at `step`: (H_q, L_q, L_k)."""
        return self[f"draft.layers.{layer}.self_attn.hook_pattern", step]

    def context_columns(self, step: int) -> int:
        """How many key columns are context (cached + new) at `step`; the rest are the block."""
        r = self.records[step]
        return r.draft_cache_before + r.ctx_len

    def filter(self, names: NameFilter = None, steps: Iterable[int] | None = None) -> Trace:
        """A smaller trace: only the named hooks and the given steps."""
        keep, wanted = _name_filter(names), set(range(len(self)) if steps is None else steps)
        out = Trace(dict(self.meta))
        out.prefill = {k: v for k, v in self.prefill.items() if keep(k)}
        for i, (rec, acts) in enumerate(zip(self.records, self.activations)):
            if i in wanted:
                out.records.append(rec)
                out.activations.append({k: v for k, v in acts.items() if keep(k)})
        return out

    def __repr__(self) -> str:
        taus = [r.acceptance_length for r in self.records]
        size = sum(t.numel() * t.element_size() for acts in [self.prefill, *self.activations] for t in acts.values())
        return (
            f"Trace(steps={len(self)}, hooks={len(self.keys())}, acceptance_lengths={taus}, "
            f"tensors={size / 1024:.1f} KiB)"
        )

    def to_html(self, path: str | Path, **options) -> Path:
        """One self-contained HTML file to step through this trace in a browser (viewer/; `options`: steps,
        layers, target_layers, precision, title, as viewer.write_html)."""
        return write_html(self, path, **options)

    # -- save / load -------------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        """folder/trace.json (records, meta) + folder/activations.safetensors."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {f"prefill/{k}": v for k, v in self.prefill.items()}
        for i, acts in enumerate(self.activations):
            tensors.update({f"step{i:05d}/{k}": v.contiguous() for k, v in acts.items()})
        save_safetensors(tensors, folder / "activations.safetensors")
        doc = {"format": FORMAT, "meta": self.meta, "records": [dataclasses.asdict(r) for r in self.records]}
        (folder / "trace.json").write_text(json.dumps(doc, indent=1) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> Trace:
        folder = Path(folder)
        for f in ("trace.json", "activations.safetensors"):
            if not (folder / f).is_file():
                raise FileNotFoundError(f"{folder} is not a saved trace: {f} is missing")
        try:
            doc = json.loads((folder / "trace.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{folder}/trace.json is damaged: it is not JSON ({e})") from None
        written = doc.get("format") if isinstance(doc, dict) else None
        if written not in READABLE:
            version = written.removeprefix("dflash_ref.trace/") if isinstance(written, str) else ""
            newer = version.isdigit() and int(version) > int(FORMAT.rsplit("/", 1)[1])
            raise ValueError(
                f"{folder}/trace.json has format {written!r}"
                + (", written by a newer dflash_ref: upgrade to read it" if newer else "")
                + f"; this version reads {', '.join(READABLE)}"
            )
        trace = cls(doc.get("meta") or {})
        try:
            trace.records = [StepRecord(**r) for r in doc["records"]]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{folder}/trace.json is damaged: its step records do not read ({e})") from None
        trace.activations = [{} for _ in trace.records]
        try:
            tensors = load_file(str(folder / "activations.safetensors"))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
            raise ValueError(f"{folder}/activations.safetensors is damaged: {e}") from None
        for key, value in tensors.items():
            where, _, name = key.partition("/")
            step = int(where[4:]) if where.startswith("step") and where[4:].isdigit() else None
            if where != "prefill" and (step is None or step >= len(trace.records)):
                raise ValueError(
                    f"{folder}/activations.safetensors is damaged: {key!r} belongs to no step of the "
                    f"{len(trace.records)} in trace.json"
                )
            target = trace.prefill if where == "prefill" else trace.activations[step]
            target[name] = value
        return trace


@contextlib.contextmanager
def tracing(
    draft: nn.Module,
    target: nn.Module | None = None,
    names: NameFilter = None,
    steps: Iterable[int] | None = None,
    meta: dict | None = None,
) -> Iterator[Trace]:
    """Record the hook points of `draft` (and of `target`, if given) whose names pass `names`
    (glob patterns such as "draft.layers.*.self_attn.hook_pattern", or a predicate) at the given
    decode `steps` (all by default). The target's hooks (attention weights) are large: pass the
    target only when you want them. All hooks are removed when the block ends."""
    if target is not None and not hook_points(target):
        raise ValueError(
            f"{type(target).__name__} has no hook points (a transformers model gives no "
            "attention weights on its SDPA path); trace the project's own Qwen3Target, or "
            "pass target=None to trace the draft only"
        )
    trace = Trace(meta)
    wanted = None if steps is None else set(steps)
    target_calls = [0]

    def record(x: torch.Tensor, point: HookPoint) -> None:
        in_prefill = target_calls[0] == 1 and point.name.startswith("target.") and not trace.records
        if in_prefill:
            trace.prefill[point.name] = x[0].detach().cpu().clone()
        elif wanted is None or len(trace.records) in wanted:
            trace._pending[point.name] = x[0].detach().cpu().clone()

    roots = [draft] + ([target] if target is not None else [])
    count = (
        target.register_forward_pre_hook(lambda *_: target_calls.__setitem__(0, target_calls[0] + 1))
        if target is not None
        else None
    )
    try:
        with hooks(roots, record, _name_filter(names)):
            yield trace
    finally:
        if count is not None:
            count.remove()
