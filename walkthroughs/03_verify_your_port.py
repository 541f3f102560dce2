# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Verify your port, stage by stage
#
# You are porting DFlash (to vLLM, SGLang, MLX, JAX, llama.cpp or your own engine) and its output
# drifts from the official one. Where is the bug? The **conformance kit** answers with the *first
# stage* along the data's walk where your implementation departs from DFlash:
#
# layer ids → extracted features → fc → C → per layer (Q, K, V after norm; Q, K after RoPE; attention
# weights; attention and layer output) → final hidden → draft logits → draft tokens → per step
# posterior, τ, bonus, cache lengths → output ids.
#
# A **golden bundle** holds tiny target and draft weights in the official Hugging Face formats, the
# inputs, and the expected tensor of every stage. This notebook writes one from the knobs below, reads it
# with numpy alone, verifies the reference, then a port with one seeded bug, and shows the dump route for
# ports outside PyTorch.
#
# **Needs**: the `notebooks` extra, and for §5 the official package, `pip install --no-deps dflash==0.1.0`
# (the kit runs it as a port; its own requirements pull packages nothing here uses, hence `--no-deps`).

# %% tags=["parameters"]
prompt = "the cat sat"  # words of the toy vocabulary; with the defaults the bundle is the one the package ships
block_size = 4  # L_q, 2 to 8
max_new_tokens = None  # block_size to 64; None: block_size, one whole block (fewer would shrink the first block)
head = 0  # the head of the diverging tensor the figure shows (0 or 1)
figures = "../figures"  # where the figures are written (this notebook writes none: its pages go to a temporary folder)

# %%
# %matplotlib inline
import sys
import tempfile
from pathlib import Path

import numpy as np

from dflash_ref.conformance import find_bundles, verify, verify_dump
from dflash_ref.tour.knobs import knob
from dflash_ref.tour.notebooks import require

require("dflash")  # §5 runs the official package
knob("block_size", block_size, range(2, 9))
max_new_tokens = block_size if max_new_tokens is None else max_new_tokens
knob("max_new_tokens", max_new_tokens, range(block_size, 65), f"a first block of {block_size} needs that many")
knob("head", head, range(2), "the toy draft's query heads")

# %% [markdown]
# ## 1. A bundle, read with numpy alone
# The package ships one bundle, the seed's example ("the cat sat", a block of 4) on the toy models of notebook 01
# with a *random* draft (the kit compares tensors; it needs no trained draft). `write_scenario` writes one from the
# knobs (with the defaults, that bundle); run
# `python -m dflash_ref golden --out golden/` for all the scenarios (multi-round acceptance, stop tokens inside
# a step, as its bonus and as the first token, GQA with a causal, a symmetric and a rotating window, block 16
# with 5 layers, a context past 4096 positions, bf16, YaRN and linear RoPE, DFlash 2, a hybrid Qwen3.5 target,
# and two sampling bundles). Writing the bundle needs torch; *reading* it does not: a JAX, MLX or C++ port reads
# the same files with its own safetensors reader, as below in a fresh process.

# %%
import subprocess  # noqa: E402

from dflash_ref.conformance.golden import write_scenario  # noqa: E402
from dflash_ref.conformance.scenarios import Scenario  # noqa: E402
from dflash_ref.tour.demo import VOCAB, demo_models, encode  # noqa: E402

scenario = Scenario(
    "walkthrough", f"the seed's example: {prompt!r}, block size {block_size}, the demo models",
    lambda: demo_models(block_size=block_size), encode(prompt)[0].tolist(), max_new_tokens, tokens=list(VOCAB),
)  # fmt: skip
folder = write_scenario(scenario, Path(tempfile.mkdtemp()) / "01_walkthrough")
[bundle] = find_bundles(folder)
reader = f"""
import sys
from dflash_ref.conformance import find_bundles
[b] = find_bundles({str(folder)!r})
print(b.name, "·", b.manifest["description"])
print("inputs:", b.inputs)
print("draft weights:", {{k: v.shape for k, v in list(b.weights("draft").items())[:4]}}, "…")
print(len(b.entries), "expected tensors; torch imported:", "torch" in sys.modules)
"""
print(subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, check=True).stdout)

# %% [markdown]
# The manifest documents every tensor, in the order of the walk: its key (the reference's hook point
# name), stage, step, layer, shape, dtype, meaning and tolerance. Floats pass when
# max|got − expected| / max(1, max|expected|) ≤ tolerance; integers must be equal.

# %%
for entry in bundle.entries[:8] + bundle.entries[-6:]:
    print(f"{entry['key']:<48} {str(entry['shape']):<14} tol {entry['tolerance']:<7g} {entry['meaning']}")

# %% [markdown]
# ## 2. The reference passes
# `verify(impl)` runs an **adapter** on each bundle and compares stage by stage. An adapter is the small piece
# of code that drives an implementation and hands the kit its tensors: `reference` (this package), `zlab` (the
# official dflash 0.1.0), the engines', or your own `package.module:factory`. The command line is
# `python -m dflash_ref verify --impl reference [--bundle DIR]`; it exits 0 only when all pass. Its last
# line says what the PASS covers: how many of the manifest's tensors were compared (a tensor a port did
# not give, or one not compared under a design **variant** it declared, is counted apart, never as agreeing).
# A variant is a design choice DFlash leaves open, which a port declares or the kit detects: a draft cache
# that keeps only the context, a last block drafted whole then cut, the three readings of a sliding window.

# %%
reference = verify("reference", folder)
print(reference.text())
assert reference.passed

# %% [markdown]
# ## 3. A port with one bug
# The adapter protocol for a PyTorch port is one method, `run(bundle) -> {key: array}`: load
# `bundle.target_dir` and `bundle.draft_dir`, decode `bundle.inputs` greedily, and return the tensors
# you computed under the manifest's keys (batch dimension dropped). Here the "port" is the reference
# with a classic RoPE mistake: the query's cos/sin rows taken from the *front* of the table (the
# context positions) instead of the last L_q (the block's).

# %%
from unittest import mock

from dflash_ref import attention
from dflash_ref.conformance.ports.reference import ReferenceAdapter
from dflash_ref.rope import rotate_half


def rope_from_the_front(q, k, cos, sin):
    cos, sin = cos[:, None], sin[:, None]
    q_len = q.shape[-2]
    return q * cos[..., :q_len, :] + rotate_half(q) * sin[..., :q_len, :], k * cos + rotate_half(k) * sin


class BuggyPort(ReferenceAdapter):
    name = "buggy-port"

    def run(self, bundle):
        with mock.patch.object(attention, "apply_sliced_rope", rope_from_the_front):
            return super().run(bundle)


buggy = verify(BuggyPort(), folder)
print(buggy.text())
assert not buggy.passed

# %% [markdown]
# The report names the first tensor off along the walk, with its cause: the kit ran the reference again under each
# catalogued mis-implementation that could first show there (`conformance/causes/`) and names the one whose tensors
# are the port's, here the RoPE rows taken from the front of the tables. Everything before it agrees,
# the same layer's Q before RoPE (after QNorm) among them; what comes after it is computed from it, so much
# downstream differs too (the next layers' inputs, hence their Q before RoPE as well, the hidden states, the
# logits). The tokens may or may not survive such a bug: comparing outputs alone can pass a wrong port. On this
# bundle:

# %%
first = buggy.first_failure
before = buggy.checks[: buggy.checks.index(first)]
same_layer_q = next(c for c in buggy.checks if c.stage == "q" and (c.step, c.layer) == (first.step, first.layer))
decisions = [c for c in buggy.checks if c.stage in ("draft_tokens", "acceptance_length", "output_ids")]
print("first divergence:", first.line())
print(f"before it, {len(before)} tensors, all agree: {all(c.status == 'pass' for c in before)}; "
      f"Q before RoPE of the same step and layer: {same_layer_q.status}")  # fmt: skip
print(f"tensors off: {sum(c.status == 'FAIL' for c in buggy.checks)} of {len(buggy.checks)}")
print("the tokens (proposals, τ, output) agree despite the bug:", all(c.status == "pass" for c in decisions))

# %% [markdown]
# **Exercise 7. Predict, then run.** Another port reads the draft's `rope_theta` wrongly (10⁶ where the bundle
# says 10⁴), and everything else right. Which stage does the kit name first? The stages, in the order of the walk:

# %%
from dflash_ref.conformance.stages import STAGES  # noqa: E402
from dflash_ref.tour.exercises import check  # noqa: E402

in_bundle = {entry["stage"] for entry in bundle.entries}
print(" → ".join([s.name for s in STAGES if s.name in in_bundle][:14]), "→ …")
your_answer = None  # a stage's name, e.g. "fc"


class WrongTheta(ReferenceAdapter):
    name = "wrong-theta"

    def load(self, bundle):
        target, draft = super().load(bundle)
        draft.rotary_emb = type(draft.rotary_emb)(draft.config.head_dim, 1e6)
        return target, draft


check(
    your_answer,
    verify(WrongTheta(), folder).first_failure.stage,
    "θ changes only the rotation: Q and K before RoPE agree, and Q, rotated first, is the first tensor off.",
)

# %% [markdown]
# `verify --html report.html` writes the same report as one page that opens offline: the first divergence's
# two tensors side by side with their difference, the attention weights labelled with the bundle's tokens.

# %%
from dflash_ref.conformance.page import write_report_html

page = write_report_html(buggy, [bundle], Path(tempfile.mkdtemp()) / "buggy_port.html")
print(page.name, f"{page.stat().st_size / 1e6:.1f} MB, self-contained")

# %%
from dflash_ref.conformance.figures import plot_tensor_diff, plot_walk

plot_walk(reference, buggy)

# %% [markdown]
# And the diverging tensor itself, one head (rows: block positions, columns: d_h):

# %%
produced = BuggyPort().run(bundle)
plot_tensor_diff(bundle.expected[first.key], produced[first.key], f"{first.key} (head {head})", head=head,
                 axes_names=("block position", "feature (d_h)"))  # fmt: skip

# %% [markdown]
# ## 4. Ports outside PyTorch: dump and compare
# Write your tensors to one `.npz` (numpy.savez) or `.safetensors` file, keyed
# `{bundle name}/{manifest key}`, and run `python -m dflash_ref verify --dump FILE [--bundle DIR]`.
# Here the buggy port's tensors are dumped with numpy and compared without running anything.

# %%
dump = Path(tempfile.mkdtemp()) / "my_port.npz"
np.savez(dump, **{f"{bundle.name}/{key}": value for key, value in produced.items()})
report = verify_dump(dump, folder)
print(report.first_failure.line())

# %% [markdown]
# ## 5. The official dflash 0.1.0 on every scenario
# This section is the same whatever the knobs: it writes every scenario the kit ships. The `zlab` adapter drives
# the official `DFlashDraftModel` and `dflash_generate` with a transformers `Qwen3ForCausalLM` target loaded from
# the bundle's folders, reading its tensors through forward hooks on its own modules. It passes on every scenario
# with a plain target it applies to; on a sliding-window layer its cache evicts keys outside the window, which the
# comparison allows (their expected weight is exactly 0), and it does not know the rotating reading of a window,
# so that bundle is not applicable to it. On the hybrid target (Qwen3.5: Gated DeltaNet layers) it rolls its cache
# back by `DynamicCache.crop` alone, and the kit names the stage: the recurrent state after the first rejection.

# %%
from dflash_ref.conformance.golden import generate_golden

every, plain = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
generate_golden(every)
for bundle in sorted(every.iterdir()):
    if not bundle.name.endswith("_hybrid_target"):
        (plain / bundle.name).symlink_to(bundle)
official = verify("zlab", plain)
print(official.text().split("\n\n")[0], "…", official.text().rsplit("\n", 1)[-1])
print("checks where evicted keys were allowed:", sum(bool(c.note) for c in official.checks))
assert official.passed, official.text()  # the notebook stops here if the official package disagrees
crop_only = verify("zlab", every / "16_hybrid_target")
print(crop_only.text()[crop_only.text().index("FIRST DIVERGENCE") :])
assert crop_only.first_failure.stage == "recurrent_state"
