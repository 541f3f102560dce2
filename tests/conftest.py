"""Shared factories for the tests: tiny random targets and drafts, and their official twins."""

from __future__ import annotations

import os
import re
import shutil

import pytest
import torch

from dflash_ref import DFlashDraftModel, DraftConfig, Qwen3Target, TargetConfig
from dflash_ref.decoding import DraftedProposal
from dflash_ref.dflash2 import make_draft
from dflash_ref.drafts.random_draft import randomize_  # noqa: F401  (tests import it from here)
from dflash_ref.fast_cpu.streamed import cpus_at_hand
from dflash_ref.threads import one_thread
from dflash_ref.viewer import browser

# -- on several workers (the README's test command: pytest-xdist, `-n auto --dist loadfile`) ------------
# Each worker takes whole files, and the CPUs are shared out: two 2-thread processes on a 2-core machine ran
# 5× slower each, not 2× (OpenMP threads spin waiting for a core), so a worker runs cpus / workers threads,
# and so do the command-line runs and notebook kernels it starts (OMP_NUM_THREADS, which they inherit).
MAX_WORKERS = 4  # each may hold SmolLM2 (0.5 GB in fp32) beside a training subprocess
# Files handed out first, slowest first (`pytest --durations`, 2-core AMD EPYC): a slow file handed out last
# would leave the other workers idle while it runs. The rest follow in their usual order.
SLOWEST_FILES = [
    "test_conformance_sampling.py",
    "test_smollm2.py",
    "test_walkthrough.py",
    "test_conformance.py",
    "test_training.py",
    "test_dflash2.py",
    "test_walkthrough_cells.py",
    "test_prompt_lookup.py",
    "test_lossless.py",
    "test_engines.py",
    "test_hybrid_target.py",
    "test_endpoint.py",
    "test_bench.py",
    "test_conformance_variants.py",
]


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without pytest-xdist the tests still run, in turn
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one worker per CPU this process may use, MAX_WORKERS at most."""
    return max(1, min(cpus_at_hand(), MAX_WORKERS))


def pytest_configure(config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, cpus_at_hand() // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items) -> None:
    """On workers, the slowest files first (the command's --no-loadscope-reorder keeps this order)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
        items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FILES)))


# -- in CI (DFLASH_REF_CI, set by .ci/run), a peer the comparisons need must be there ----------------------
# Parity tests skip where the official `dflash`, transformers or MLX is not installed (a partial set-up);
# in CI such a skip would hide a comparison that never ran, so it fails instead, naming the peer.
PEERS = ("dflash", "transformers", "mlx", "gguf", "scipy", "jupytext", "nbformat", "selenium")


def _missing_peer(report) -> str | None:
    """The peer a skip report says could not be imported (pytest.importorskip's reason), else None."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
    said = re.search(r"could not import '([\w.]+)'", reason)
    if said is None:
        return None
    top = said.group(1).split(".")[0]  # mlx.core is MLX; mlx_dspark, a port the ports' venv has, is no peer
    return top if top in PEERS else None


def _fail_missing_peer(report) -> None:
    peer = _missing_peer(report) if report.skipped and os.environ.get("DFLASH_REF_CI") else None
    if peer is not None:
        report.outcome = "failed"
        report.longrepr = f"{peer} is not installed, and CI runs every comparison: install the test extra and {peer}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_missing_peer(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_missing_peer(outcome.get_result())


def target_config(**overrides) -> TargetConfig:
    kw = dict(
        vocab_size=12,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        rope_theta=10000.0,
    )
    kw.update(overrides)
    return TargetConfig(**kw)


def chat_target_folder(folder, tokenizer, num_hidden_layers: int = 4, max_position_embeddings: int = 64):
    """A tiny random Qwen3 of SmolLM2's vocabulary saved as a Hugging Face folder with `tokenizer` (SmolLM2's,
    chat template included): a `--target DIR` that loads in a second. → folder"""
    from dflash_ref import save_target

    config = target_config(
        vocab_size=49152, num_hidden_layers=num_hidden_layers, max_position_embeddings=max_position_embeddings
    )
    save_target(randomize_(Qwen3Target(config), 0), folder)
    tokenizer.save_pretrained(folder)
    return folder


def draft_config(target: TargetConfig | None = None, **overrides) -> DraftConfig:
    target = target or target_config()
    kw = dict(
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=target.max_position_embeddings,
        rope_theta=target.rope_theta,
        num_target_layers=target.num_hidden_layers,
        block_size=4,
        mask_token_id=target.vocab_size - 1,
    )
    kw.update(overrides)
    return DraftConfig(**kw)


@pytest.fixture(scope="session")
def golden(tmp_path_factory):
    """Every golden bundle (`python -m dflash_ref golden`), written once per test process for the conformance kit's
    files that read them (test_conformance, _variants, _ports, _coverage: each wrote them again), on one thread as
    those files run. Read only: a test that damages a bundle damages a copy."""
    from dflash_ref.conformance.golden import generate_golden

    out = tmp_path_factory.mktemp("golden")
    with one_thread():
        generate_golden(out)
    return out


@pytest.fixture(scope="module")
def one_thread_module():
    """Tiny models are overhead-bound: one intra-op thread is faster than two on a small machine.
    Modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread_module")`."""
    with one_thread():
        yield


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, atol: float = 1e-5) -> None:
    """max |ours − theirs| ≤ atol · max(1, max |theirs|): absolute for tensors of order one, relative
    for the residual stream, which grows through the layers (fp32 rounding scales with it)."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    diff = (ours.float() - theirs.float()).abs().max().item()
    scale = max(1.0, theirs.float().abs().max().item())
    assert diff <= atol * scale, f"max |diff| {diff:.3g} > {atol:g} × {scale:.3g}"


def use_explicit_attention(model: torch.nn.Module) -> int:
    """Force the explicit math path in every attention module; returns how many were switched."""
    switched = 0
    for m in model.modules():
        if hasattr(m, "use_sdpa"):
            m.use_sdpa = False
            switched += 1
    return switched


def make_pair(
    seed: int = 0, target_overrides: dict | None = None, draft_overrides: dict | None = None, std: float = 0.5
) -> tuple[Qwen3Target, DFlashDraftModel]:
    tc = target_config(**(target_overrides or {}))
    target = randomize_(Qwen3Target(tc), seed, std)
    draft = randomize_(make_draft(draft_config(tc, **(draft_overrides or {}))), seed + 10_000, std)
    return target, draft


def gate_cuts(step) -> list[bool]:
    """For `spec_generate(on_step=…)`: [whether the verify gate cut the block] where a draft pass drafted
    more than two tokens (a block the gate may cut), else []."""
    proposal = step.proposal
    if not isinstance(proposal, DraftedProposal) or proposal.drafted.shape[1] <= 2:
        return []
    return [proposal.block_ids.shape[1] < proposal.drafted.shape[1]]


def hand_selector():
    """A DFlash 2 selector small enough to score by hand: V = 3, d = 1, rank 1, K = 2, E_pred (1, −1, 2),
    E_succ (0, 3, −3), P = 1, so score_k = z_k + E_pred(prev) · h · E_succ(c_k)."""
    from dflash_ref.candidate_selector import CandidateSelector

    selector = CandidateSelector(vocab_size=3, hidden_size=1, rank=1, top_k=2)
    with torch.no_grad():
        selector.predecessor_codebook.copy_(torch.tensor([[1.0], [-1.0], [2.0]]))
        selector.successor_codebook.copy_(torch.tensor([[0.0], [3.0], [-3.0]]))
        selector.hidden_projection.weight.fill_(1.0)
    return selector


def official_twins(target: Qwen3Target, draft: DFlashDraftModel):
    """transformers' Qwen3ForCausalLM and the official DFlashDraftModel with the same weights."""
    transformers = pytest.importorskip("transformers")
    official = pytest.importorskip("dflash.model")
    hf_target = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**target.config.to_dict())).eval()
    hf_target.load_state_dict(target.state_dict())
    off_draft = official.DFlashDraftModel(transformers.Qwen3Config(**draft.config.to_dict())).eval()
    off_draft.load_state_dict(draft.state_dict())
    return hf_target, off_draft


@pytest.fixture(autouse=True)
def _official_runs_on_cpu(monkeypatch):
    """dflash 0.1.0's return_stats=True calls torch.cuda.synchronize(), which fails on CPU (a known
    bug): time with perf_counter instead, so its acceptance lengths can be compared here."""
    try:
        import time

        import dflash.model as official
    except ImportError:
        return
    monkeypatch.setattr(official, "_cuda_time", time.perf_counter)


@pytest.fixture(scope="module")
def chrome():
    """Headless Chromium through Selenium and Debian's chromedriver (the README's test command installs both), for
    the pages a person opens (the trace viewer, the divergence page)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    driver_path = shutil.which("chromedriver")
    if browser.chromium() is None or driver_path is None:
        pytest.skip("no Chromium and chromedriver here: apt-get install chromium chromium-driver (as the README says)")
    options = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1600"):
        options.add_argument(flag)
    options.binary_location = browser.chromium()
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    yield driver
    driver.quit()
