"""Engine certification against the built-in engine answering at each capture level (real HTTP, real tokenizer).

The real-vLLM side (tokens + processed, and raw logprobs refused for `train`) is in test_vllm_real.py.
"""

import pytest

from swe_gym_env.core.assets import tokenizer_file
from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.engine.app import Engine, create_engine_app
from swe_gym_env.server.engine.certify import certify
from swe_gym_env.server.engine.chat import ChatRenderer
from swe_gym_env.server.engine.policy import make_policy
from swe_gym_env.server.rollout import RolloutService, ServerConfig
from swe_gym_env.wire import RolloutRequest

from helpers import MODEL, Served

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_tokenizer")]


def engine_at(level: str):
    engine = Engine(ChatRenderer(tokenizer_file()), make_policy("oracle"), MODEL)
    engine.capture_level = level
    return create_engine_app(engine)


@pytest.mark.parametrize("level", ["tokens", "logprobs", "text"])
async def test_certification_reads_the_capture_level(level):
    with Served(engine_at(level)) as url:
        cert = await certify(f"{url}/v1")
    assert cert.reachable and cert.served_model == MODEL and cert.max_model_len == 8192
    assert cert.level == level
    assert cert.logprobs_mode == "placeholder"  # the built-in engine says it is not a model


@pytest.mark.parametrize("level", ["logprobs", "text"])
async def test_train_rollouts_are_refused_below_tokens(level):
    with Served(engine_at(level)) as url:
        service = RolloutService(ServerConfig(engines={"default": EngineTarget(f"{url}/v1", MODEL)}), CaptureProxy())
        result = await service.run(RolloutRequest(purpose="train"))
    assert not result.ok and result.phase == "validate" and result.reward is None
    assert "purpose=train needs an engine that returns token ids" in result.error
    assert result.capture_level == level and result.turns == []


async def test_unreachable_engine_is_a_validate_failure():
    service = RolloutService(
        ServerConfig(engines={"default": EngineTarget("http://127.0.0.1:9/v1", MODEL)}), CaptureProxy()
    )
    result = await service.run(RolloutRequest())
    assert not result.ok and result.phase == "validate" and "engine unreachable" in result.error


@pytest.mark.integration
@pytest.mark.usefixtures("need_pi")
async def test_eval_against_an_engine_without_ids_runs_black_box(tmp_path):
    from swe_gym_env.commands.runner import local_service

    with Served(engine_at("text")) as url:
        config = ServerConfig(engines={"default": EngineTarget(f"{url}/v1", MODEL)}, results_dir=tmp_path / "results")
        async with local_service(config) as service:
            result = await service.run(RolloutRequest(purpose="eval"))
    assert result.ok and result.reward == 1.0, (result.phase, result.error)
    assert result.capture_level == "text" and result.turns == [] and result.logprobs_mode is None
    assert any(f.code == "black_box" for f in result.findings)
