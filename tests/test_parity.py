"""Trainer-side logprob parity (client/parity.py, `swe-gym-env parity`) and the GRPO example (examples/train_grpo.py).

- Unit (the app's venv, no torch): loading rollouts (file, JSONL, status, results store), the shift detector, the
  sampling parameters read from a turn, and the CLI naming the fix when no trainer venv exists.
- Integration (real vLLM, CPU build, SmolLM2-135M in float32, processed logprobs; `bash scripts/setup_vllm.sh` and
  `bash scripts/setup_trl.sh`; Pi from `swe-gym-env setup`): one vLLM + one server for the module; two real Pi
  rollouts captured through the server at temperature 1.0 and 0.7, then:
  (a) parity through the CLI (which re-runs itself in .trl-venv): every turn within the fp32 tolerance (mean |Δ|
      <= 1e-3, max <= 1e-2; measured ~1e-5), by file and by id from the server;
  (b) broken copies of the same turns fail, each with its cause named: shifted by one token, raw (temperature not
      applied) logprobs, a re-tokenised completion;
  (c) a bfloat16 trainer passes the bf16 tolerance and is visibly off the fp32 one (rounding, not a bug);
  (d) examples/train_grpo.py runs 2 optimizer steps on rollouts of 2 tasks x 2, loading the new weights into the
      serving vLLM between steps; TRL's view of the captured logprobs matches its own to fp32 noise.
  (e) the example's weight sync really changes what vLLM serves (a perturbed copy in, the originals back).
  (d) and (e) run last: they reload vLLM's weights.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from conftest import require

from swe_gym_env.client.parity import TOLERANCES, load_rollouts, sampling_of, shift_of
from swe_gym_env.core.assets import tokenizer_dir
from swe_gym_env.trace.forms import summary_of
from swe_gym_env.wire import RolloutResult, RolloutStatus, RolloutSummary, Turn

from helpers import ME, MODEL, Stack, full_turns, rows_match_export

REPO = Path(__file__).resolve().parent.parent
TRL_PYTHON = REPO / ".trl-venv" / "bin" / "python"
FP32 = TOLERANCES["fp32"]


def _turn(i: int = 0, temperature: float | None = None, n: int = 6) -> Turn:
    return Turn(
        index=i, prompt_token_ids=[1, 2, 3], completion_token_ids=list(range(10, 10 + n)),
        logprobs=[-0.1 * k for k in range(n)], finish_reason="stop", streamed=True, wall_s=0.1,
        request={} if temperature is None else {"temperature": temperature}, response_message={},
    )  # fmt: skip


def _result(rid: str = "r1", turns: list[Turn] | None = None) -> RolloutResult:
    return RolloutResult(rollout_id=rid, ok=True, reward=0.0, harness="pi", sandbox="local", turns=turns or [_turn()])


# ---------------------------------------------------------------------------------------------------------------
# unit


def test_load_rollouts_from_files_status_and_store(tmp_path, monkeypatch):
    a, b = _result("aaaaaaaa"), _result("bbbbbbbb")
    (tmp_path / "one.json").write_text(a.model_dump_json())
    (tmp_path / "many.jsonl").write_text(a.model_dump_json() + "\n\n" + b.model_dump_json() + "\n")
    status = RolloutStatus(rollout_id=a.rollout_id, state="finished", summary=summary_of(a), result=a)
    (tmp_path / "status.json").write_text(status.model_dump_json())
    running = RolloutStatus(
        rollout_id="cccccccc", state="running",
        summary=RolloutSummary(rollout_id="cccccccc", instance_id=None, harness="pi", sandbox="local",
                               phase="agent", state="running"),
    )  # fmt: skip
    (tmp_path / "running.json").write_text(running.model_dump_json())
    assert [r.rollout_id for r in load_rollouts(str(tmp_path / "one.json"))] == ["aaaaaaaa"]
    assert [r.rollout_id for r in load_rollouts(str(tmp_path / "many.jsonl"))] == ["aaaaaaaa", "bbbbbbbb"]
    assert load_rollouts(str(tmp_path / "status.json"))[0].turns == a.turns
    with pytest.raises(ValueError, match="running, not finished"):
        load_rollouts(str(tmp_path / "running.json"))
    monkeypatch.setenv("SWE_GYM_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data" / "results").mkdir(parents=True)
    (tmp_path / "data" / "results" / "bbbbbbbb.json").write_text(b.model_dump_json())
    assert load_rollouts("bbbbbbbb")[0].rollout_id == "bbbbbbbb"
    with pytest.raises(ValueError, match="no rollout"):
        load_rollouts("dddddddd")
    with pytest.raises(ValueError, match="neither a file nor a rollout id"):
        load_rollouts("../no-such/rollout")


def test_shift_detector_finds_the_offset_and_nothing_else():
    computed = [-0.5, -1.25, -3.0, -0.01, -2.2, -0.7, -4.1, -0.3]
    assert shift_of(computed, computed, FP32) is None  # aligned values never look shifted
    moved = computed[1:]  # captured[j] belongs to token j+1: the logprobs sit one token early
    assert shift_of(moved, computed, FP32) == 1
    assert shift_of([0.0, *computed[:-1]], computed, FP32) == -1
    assert shift_of([-9.0] * 8, computed, FP32) is None
    assert shift_of(computed[:3], computed, FP32) is None  # too little overlap to call it


def test_sampling_of_reads_the_forwarded_request():
    assert sampling_of(_turn()) == (1.0, None, None)  # vLLM's defaults: Pi sends no temperature
    t = _turn(temperature=0.7)
    t.request.update(top_k=-1, top_p=1.0)
    assert sampling_of(t) == (0.7, None, None)
    t.request.update(top_k=20, top_p=0.9)
    assert sampling_of(t) == (0.7, 20, 0.9)


def test_cli_parity_without_torch_names_the_fix(tmp_path):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("this interpreter has torch: the CLI runs parity in process")
    env = {**os.environ, "SWE_GYM_TRAINER_PYTHON": str(tmp_path / "no-python")}
    p = subprocess.run([*ME, "parity", "--rollout", "x", "--model", "y"], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "scripts/setup_trl.sh" in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------------------------------
# integration: real vLLM, real Pi rollouts through the server


def _wait_vllm(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    start = time.monotonic()
    while True:
        if proc.poll() is not None:
            pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"vLLM not healthy after {timeout_s} s:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(1)


def _warm_up(url: str) -> None:
    """One tiny chat request: vLLM's first one costs ~10x the next (one-time setup in the engine), and on a loaded
    2-core machine that once took longer than the rollouts' engine certification allows (30 s: `engine unreachable:
    ReadTimeout` at validate). Paid here, with room, instead of inside the first rollout."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "logprobs": True}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text


VLLM = pytest.mark.xdist_group("vllm")  # the real vLLM of `live`: one vLLM at a time, per run (tests/conftest.py)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """vLLM (float32, processed logprobs, dev endpoints for weight reload) + the server + 2 captured rollouts."""
    from test_vllm_real import VLLM_ARGS, VLLM_ENV, VLLM_PYTHON, _free_port, _stop

    from swe_gym_env.client.ws_client import SweGymWSClient
    from swe_gym_env.wire import RolloutRequest

    model = tokenizer_dir()
    require(VLLM_PYTHON.is_file(), f"{VLLM_PYTHON} missing: run `bash scripts/setup_vllm.sh`")
    require(TRL_PYTHON.is_file(), f"{TRL_PYTHON} missing: run `bash scripts/setup_trl.sh`")
    require((model / "model.safetensors").is_file(), f"SmolLM2 weights missing in {model}: scripts/setup_vllm.sh")
    tmp = tmp_path_factory.mktemp("parity")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VLLM_ENV, VLLM_SERVER_DEV_MODE="1", VLLM_RPC_BASE_PATH=str(tmp))  # its ZMQ sockets, not in /tmp
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), *VLLM_ARGS]
    with open(tmp / "vllm.log", "wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--host", "127.0.0.1", "--port", str(port)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    vllm = f"http://127.0.0.1:{port}"
    stack = None
    try:
        # The server starts while vLLM does (it asks nothing of its engine before a rollout): ~60 s of vLLM imports
        # on one core, the server's start on the other.
        stack = Stack("noop", engine_up=False, server_engine_url=f"{vllm}/v1", env={"SWE_GYM_DATA_DIR": str(tmp)})
        server = f"http://127.0.0.1:{stack.server_port}"
        _wait_vllm(vllm, proc, tmp / "vllm.log")
        _warm_up(vllm)

        async def capture() -> list[RolloutResult]:
            reqs = [
                RolloutRequest(purpose="train", max_model_calls=2, max_tokens=64, temperature=t, seed=s, deadline_s=600)
                for t, s in ((1.0, 1), (0.7, 2))
            ]
            async with SweGymWSClient(server) as c:
                return list(await asyncio.gather(*(c.run_rollout(r, timeout_s=900) for r in reqs)))

        results = asyncio.run(capture())
        for r in results:
            assert r.ok and r.turns, (r.error, r.phase)
            assert r.logprobs_mode == "processed" and r.capture_level == "tokens", r
            asyncio.run(rows_match_export(stack, r))
        path = tmp / "rollouts.jsonl"
        path.write_text("".join(r.model_dump_json() + "\n" for r in results))
        yield {"vllm": vllm, "server": server, "model": str(model), "results": results, "file": path, "tmp": tmp}
    finally:
        if stack is not None:
            stack.stop()
        _stop(proc)


def parity(*args: str, timeout: int = 900) -> tuple[int, dict, str]:
    """`swe-gym-env parity ... --json` from the app's venv (it re-runs itself in .trl-venv)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.run([*ME, "parity", *args, "--json"], env=env, capture_output=True, text=True, timeout=timeout)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    assert lines, f"rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p.returncode, json.loads(lines[-1]), p.stderr


def _table(report: dict) -> str:
    return "\n".join(
        f"  {t['rollout_id'][:30]:<30} turn {t['turn']} tokens {t['tokens']:>3} T={t['temperature']:.2f} "
        f"mean {t['mean_abs']:.2e} max {t['max_abs']:.2e} {'ok' if t['ok'] else 'FAIL: ' + str(t['diagnosis'])}"
        for t in report["turns"]
    )


@pytest.mark.integration
@pytest.mark.slow
@VLLM
def test_parity_on_real_captured_rollouts(need_pi, live):
    rc, report, err = parity("--rollout", str(live["file"]), "--model", live["model"])
    print("parity (fp32 vLLM vs fp32 transformers):\n" + _table(report))
    assert rc == 0 and report["ok"], _table(report) + err[-2000:]
    assert {t["temperature"] for t in report["turns"]} == {1.0, 0.7}
    assert sum(t["tokens"] for t in report["turns"]) == sum(
        len(t.completion_token_ids) for r in live["results"] for t in r.turns
    )
    for t in report["turns"]:
        assert t["mean_abs"] <= FP32.mean and t["max_abs"] <= FP32.max and t["first_mismatch"] is None
    # by id, from the server that ran them
    rid = live["results"][1].rollout_id
    rc, by_id, err = parity("--rollout", rid, "--server", live["server"], "--model", live["model"])
    assert rc == 0 and [t["rollout_id"] for t in by_id["turns"]] == [rid] * len(live["results"][1].turns), err


def _retokenised(turn: Turn) -> list[int]:
    """The completion's text re-encoded in two pieces split inside a word: same text, other ids (a trainer that
    re-tokenises decoded text)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir() / "tokenizer.json"))
    text = tok.decode(turn.completion_token_ids, skip_special_tokens=False)
    cut = next((i for i in range(len(text) // 2, len(text) - 1) if text[i].isalpha() and text[i + 1].isalpha()), 1)
    ids = tok.encode(text[:cut], add_special_tokens=False).ids + tok.encode(text[cut:], add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text and ids != turn.completion_token_ids
    return ids


@pytest.mark.integration
@pytest.mark.slow
@VLLM
def test_broken_copies_fail_and_say_why(need_pi, live):
    hot, cold = live["results"]  # temperature 1.0, 0.7
    t, c = full_turns(hot)[0], full_turns(cold)[0]  # the full form: each copy below breaks its whole prompt
    assert len(t.completion_token_ids) >= 6 and len(c.completion_token_ids) >= 6
    shifted = t.model_copy(
        update={
            "prompt_token_ids": [*t.prompt_token_ids, t.completion_token_ids[0]],
            "completion_token_ids": t.completion_token_ids[1:],
            "logprobs": t.logprobs[:-1],
        }
    )
    raw = t.model_copy(update={"request": {**t.request, "temperature": 0.7}})  # values at T=1.0 labelled 0.7
    retok = c.model_copy(update={"completion_token_ids": _retokenised(c)})
    copies = [
        hot.model_copy(update={"rollout_id": "shifted-copy", "turns": [shifted]}),
        hot.model_copy(update={"rollout_id": "raw-copy", "turns": [raw]}),
        cold.model_copy(update={"rollout_id": "retokenised-copy", "turns": [retok]}),
    ]
    path = live["tmp"] / "broken.jsonl"
    path.write_text("".join(r.model_dump_json() + "\n" for r in copies))
    rc, report, _ = parity("--rollout", str(path), "--model", live["model"])
    print("parity of broken copies:\n" + _table(report))
    assert rc == 1 and not report["ok"]
    by = {t["rollout_id"]: t for t in report["turns"]}
    assert not any(t["ok"] for t in by.values())
    assert by["shifted-copy"]["diagnosis"].startswith("shifted by -1"), by["shifted-copy"]
    assert by["shifted-copy"]["mean_abs"] > 1.0  # loud: nats, not rounding
    assert by["raw-copy"]["diagnosis"].startswith("raw logprobs"), by["raw-copy"]
    assert by["retokenised-copy"]["diagnosis"].startswith(("length", "ids differ")), by["retokenised-copy"]


@pytest.mark.integration
@pytest.mark.slow
@VLLM
def test_bf16_trainer_is_within_bf16_tolerance_only(need_pi, live):
    rc, report, err = parity("--rollout", str(live["file"]), "--model", live["model"], "--dtype", "bfloat16")
    print("parity (fp32 vLLM vs bf16 transformers):\n" + _table(report))
    bf16 = TOLERANCES["bf16"]
    assert report["tolerance"] == {"mean": bf16.mean, "max": bf16.max}
    assert rc == 0 and report["ok"], _table(report) + err[-2000:]
    assert max(t["mean_abs"] for t in report["turns"]) > FP32.mean  # bf16 rounding is visible at fp32's bound


@pytest.mark.integration
@pytest.mark.slow
@VLLM
def test_train_grpo_example_runs_two_steps_with_weight_sync(need_pi, live, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1",
        TOKENIZERS_PARALLELISM="false", HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"),
    )  # fmt: skip
    cmd = [
        str(TRL_PYTHON), str(REPO / "examples" / "train_grpo.py"), "--server", live["server"],
        "--model", live["model"], "--engine-url", f"{live['vllm']}/v1", "--steps", "2", "--tasks", "2",
        "--group", "2", "--max-model-calls", "2", "--max-tokens", "48", "--train-last-layers", "1",
        "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    steps = [json.loads(x[5:]) for x in p.stdout.splitlines() if x.startswith("STEP ")]
    print(f"train_grpo.py in {time.monotonic() - start:.0f} s:\n" + "\n".join(json.dumps(s) for s in steps))
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["rollouts"] == 4 and s["trainable_tokens"] > 0 and s["weight_sync_s"] is not None, s
        assert len(s["groups"]) == 2 and all(len(v) == 2 for v in s["groups"].values()), s
        # TRL's tensors hold the captured logprobs at the right tokens: fp32 vLLM vs fp32 trainer, on-policy
        # (step 2 runs on the weights step 1 wrote into vLLM).
        assert s["abs_logprob_delta"]["max"] <= FP32.max, s
        assert 0.99 <= s["is_ratio"]["min"] <= s["is_ratio"]["max"] <= 1.01, s


SYNC_SCRIPT = r"""
import json, sys
import httpx, torch
sys.path.insert(0, sys.argv[3])
from train_grpo import sync_weights
from transformers import AutoModelForCausalLM

vllm, model_dir, _, workdir = sys.argv[1:5]
body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 1, "seed": 0, "temperature": 1.0, "logprobs": True, "top_logprobs": 1}
def top():
    r = httpx.post(f"{vllm}/v1/chat/completions", json=body, timeout=120).json()
    return r["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]
before = top()
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
with torch.no_grad():
    model.model.norm.weight.mul_(1.5)  # a visible change of the policy
sync_weights(model, f"{vllm}/v1", workdir)
changed = top()
sync_weights(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), f"{vllm}/v1", workdir)
restored = top()
print("RESULT " + json.dumps({"before": before, "changed": changed, "restored": restored}))
"""


@pytest.mark.integration
@pytest.mark.slow
@VLLM
def test_weight_sync_changes_what_vllm_serves(need_pi, live, tmp_path):
    """The example's sync_weights (save_pretrained + vLLM's reload_weights) really swaps the served weights."""
    script = tmp_path / "sync.py"
    script.write_text(SYNC_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    args = [live["vllm"], live["model"], str(REPO / "examples"), str(tmp_path / "w")]
    p = subprocess.run([str(TRL_PYTHON), str(script), *args], env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    res = json.loads(next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))[7:])
    print(f"weight sync: {res}")
    assert res["changed"] != res["before"]  # the served distribution moved with the trainer's weights
    assert res["restored"]["token"] == res["before"]["token"]
    assert res["restored"]["logprob"] == pytest.approx(res["before"]["logprob"], abs=1e-4)
