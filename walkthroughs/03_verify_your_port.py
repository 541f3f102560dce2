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
# inputs, and the expected tensor of every stage. This notebook reads one with numpy alone, verifies
# the reference, then a port with one seeded bug, and shows the dump route for ports outside PyTorch.

# %%
# %matplotlib inline
import sys

import numpy as np

from dflash_ref.conformance import find_bundles, verify, verify_dump

print("torch imported so far:", "torch" in sys.modules)

# %% [markdown]
# ## 1. A bundle, read with numpy alone
# The package ships one bundle, the walkthrough's scenario (3-token prompt, block size 4); run
# `python -m dflash_ref golden --out golden/` for all sixteen greedy scenarios and the two sampling
# bundles (multi-round acceptance, stop tokens inside a step, as its bonus and as the first token, GQA
# with a causal, a symmetric and a rotating window, block 16 with 5 layers, a context past 4096
# positions, bf16, YaRN and linear RoPE, DFlash 2, a hybrid Qwen3.5 target). Nothing above imported torch: a JAX, MLX or
# C++ port reads the same files with its own safetensors reader.

# %%
[bundle] = find_bundles()
print(bundle.name, "·", bundle.manifest["description"])
print("inputs:", bundle.inputs)
print("draft weights:", {k: v.shape for k, v in list(bundle.weights("draft").items())[:4]}, "…")
print(len(bundle.entries), "expected tensors; torch imported:", "torch" in sys.modules)

# %% [markdown]
# The manifest documents every tensor, in the order of the walk: its key (the reference's hook point
# name), stage, step, layer, shape, dtype, meaning and tolerance. Floats pass when
# max|got − expected| / max(1, max|expected|) ≤ tolerance; integers must be equal.

# %%
for entry in bundle.entries[:8] + bundle.entries[-6:]:
    print(f"{entry['key']:<48} {str(entry['shape']):<14} tol {entry['tolerance']:<7g} {entry['meaning']}")

# %% [markdown]
# ## 2. The reference passes
# `verify(impl)` runs an *adapter* (`reference`, `zlab` for the official dflash 0.1.0, or your
# `package.module:factory`) on each bundle and compares stage by stage. The command line is
# `python -m dflash_ref verify --impl reference [--bundle DIR]`; it exits 0 only when all pass. Its last
# line says what the PASS covers: how many of the manifest's tensors were compared (a tensor a port did
# not give, or one not compared under a design variant it declared, is counted apart, never as agreeing).

# %%
reference = verify("reference")
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
from dflash_ref.conformance.adapters import ReferenceAdapter
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


buggy = verify(BuggyPort())
print(buggy.text())
assert not buggy.passed

# %% [markdown]
# In layer 0, Q before RoPE (after QNorm) still agrees; Q *after* RoPE in layer 0 of the first step
# is the first tensor off (the 3 QNorm failures are layer 1's, downstream). The attention weights,
# hidden states and logits downstream differ too, yet on this bundle the draft's argmax tokens, τ
# and output ids survive the bug: comparing tokens alone would have passed this port. The report
# names the origin. The figure shows every tensor's error along the walk for both implementations:

# %% [markdown]
# `verify --html report.html` writes the same report as one page that opens offline: the first divergence's
# two tensors side by side with their difference, the attention weights labelled with the bundle's tokens.

# %%
import tempfile
from pathlib import Path

from dflash_ref.conformance.page import write_report_html

page = write_report_html(buggy, [bundle], Path(tempfile.mkdtemp()) / "buggy_port.html")
print(page.name, f"{page.stat().st_size / 1e6:.1f} MB, self-contained")

# %%
from dflash_ref.conformance.figures import plot_tensor_diff, plot_walk

plot_walk(reference, buggy)

# %% [markdown]
# And the diverging tensor itself, head 0 (rows: block positions, columns: d_h):

# %%
first = buggy.first_failure
produced = BuggyPort().run(bundle)
plot_tensor_diff(bundle.expected[first.key], produced[first.key], f"{first.key} (head 0)")

# %% [markdown]
# ## 4. Ports outside PyTorch: dump and compare
# Write your tensors to one `.npz` (numpy.savez) or `.safetensors` file, keyed
# `{bundle name}/{manifest key}`, and run `python -m dflash_ref verify --dump FILE [--bundle DIR]`.
# Here the buggy port's tensors are dumped with numpy and compared without running anything.

# %%
dump = Path(tempfile.mkdtemp()) / "my_port.npz"
np.savez(dump, **{f"{bundle.name}/{key}": value for key, value in produced.items()})
report = verify_dump(dump)
print(report.first_failure.line())

# %% [markdown]
# ## 5. The official dflash 0.1.0 on every scenario
# The `zlab` adapter drives the official `DFlashDraftModel` and `dflash_generate` with a transformers
# `Qwen3ForCausalLM` target loaded from the bundle's folders, reading its tensors through forward
# hooks on its own modules. It passes on every scenario with a plain target it applies to; on a
# sliding-window layer its cache evicts keys outside the window, which the comparison allows (their
# expected weight is exactly 0), and it does not know the rotating reading of a window, so that bundle
# is not applicable to it. On the hybrid target (Qwen3.5: Gated DeltaNet layers) it rolls its cache back
# by `DynamicCache.crop` alone, and the kit names the stage: the recurrent state after the first rejection.

# %%
from dflash_ref.conformance.golden import generate_golden

folder, plain = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
generate_golden(folder)
for bundle in sorted(folder.iterdir()):
    if not bundle.name.endswith("_hybrid_target"):
        (plain / bundle.name).symlink_to(bundle)
official = verify("zlab", plain)
print(official.text().split("\n\n")[0], "…", official.text().rsplit("\n", 1)[-1])
print("checks where evicted keys were allowed:", sum(bool(c.note) for c in official.checks))
assert official.passed, official.text()  # the notebook stops here if the official package disagrees
crop_only = verify("zlab", folder / "16_hybrid_target")
print(crop_only.text()[crop_only.text().index("FIRST DIVERGENCE") :])
assert crop_only.first_failure.stage == "recurrent_state"
