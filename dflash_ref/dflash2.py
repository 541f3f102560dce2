"""DFlash 2: a DFlash 1 draft (draft_layer.py, draft_model.py) with two changes, each a class that
extends DFlash 1's, as the official `DFlash2DraftModel` extends its `DFlashDraftModel`:

    layer      each sublayer f inside its grouped dynamic causal convolution (dynamic_conv.py):
               H'  = H  + finish(Attn(prepare(RMSNorm_in(H)), C))
               H'' = H' + finish(MLP(prepare(RMSNorm_post(H'))))
    proposals  a path through the top-M candidates of every block position, chosen by the candidate
               selector (candidate_selector.py), instead of the argmax (or a draw) of the logits

Everything else (context, KV injection, the loop, the verifiers) is DFlash 1's. The config says which
version a folder holds (`architectures`, `DraftConfig.version`); `make_draft(config)` builds that one.
"""

from __future__ import annotations

import torch

from .acceptance import sample_probs
from .candidate_selector import CandidateSelector
from .config import DraftConfig
from .draft_layer import DFlashDecoderLayer
from .draft_model import DFlashDraftModel
from .dynamic_conv import GroupedDynamicCausalConv
from .hooks import name_hook_points


class DFlash2DecoderLayer(DFlashDecoderLayer):
    def __init__(self, config: DraftConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        d, k, g = config.hidden_size, config.conv_kernel_size, config.conv_group_size
        self.attention_conv = GroupedDynamicCausalConv(d, k, g)
        self.mlp_conv = GroupedDynamicCausalConv(d, k, g)

    def attend(self, x, *attention_inputs, blocks: int = 1):
        """finish(Attn(prepare(x), C)), with the taps of x."""
        prepared, taps = self.attention_conv.prepare(x, blocks)
        return self.attention_conv.finish(super().attend(prepared, *attention_inputs, blocks=blocks), taps, blocks)

    def feed_forward(self, x: torch.Tensor, *, blocks: int = 1) -> torch.Tensor:
        """finish(MLP(prepare(x))), with the taps of x."""
        prepared, taps = self.mlp_conv.prepare(x, blocks)
        return self.mlp_conv.finish(super().feed_forward(prepared, blocks=blocks), taps, blocks)


class DFlash2DraftModel(DFlashDraftModel):
    version = 2
    decoder_layer = DFlash2DecoderLayer

    def __init__(self, config: DraftConfig) -> None:
        super().__init__(config)
        self.candidate_selector = CandidateSelector(
            config.vocab_size, config.hidden_size, config.selector_rank, config.selector_top_k
        )
        name_hook_points(self, "draft")  # the selector's hook points too

    def choose_tokens(self, hidden, logits, anchor, temperature: float, top_p: float, top_k: int):
        """The selector's path from the anchor x_0: d_1..d_γ (1, γ), q (1, γ, M) over its candidates
        (1, γ, M) when T > 0, else None (the greedy path). Like the official draft side, no top-p / top-k."""
        path, candidates, q = self.candidate_selector.select(hidden, logits, anchor, temperature, sample_probs)
        return path, q, candidates


def selector_of(draft) -> CandidateSelector | None:
    """A DFlash 2 draft's candidate selector; None for a DFlash 1 draft (or one proposing by argmax)."""
    return getattr(draft, "candidate_selector", None)


def make_draft(config: DraftConfig) -> DFlashDraftModel:
    """The draft model of the config's version: DFlash 1 or DFlash 2."""
    return (DFlash2DraftModel if config.version == 2 else DFlashDraftModel)(config)
