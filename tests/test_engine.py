import json

import pytest

from swe_gym_env.server.engine.policy import OraclePolicy, _hunks
from swe_gym_env.tasks.catalog import bundled_tasks

from helpers import MODEL, PI_TOOLS, engine_client, sse_events

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("need_tokenizer")]


def pi_request(task, **extra):
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": task.problem_statement}]}],
        "tools": PI_TOOLS,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 1,
        "return_tokens_as_token_ids": True,
        **extra,
    }


async def test_non_streamed_reply_carries_vllm_capture_fields():
    task = bundled_tasks()[0]
    async with engine_client() as c:
        r = await c.post("/v1/chat/completions", json=pi_request(task))
        assert r.status_code == 200
        body = r.json()
        choice = body["choices"][0]
        ids, lps = choice["token_ids"], choice["logprobs"]["content"]
        assert len(ids) == len(lps) == body["usage"]["completion_tokens"]
        assert [e["token"] for e in lps] == [f"token_id:{i}" for i in ids]
        assert all(e["logprob"] <= 0 for e in lps)
        assert ids[-1] == 2  # <|im_end|> closes the completion, with its own logprob
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert call["function"]["name"] == "edit"
        assert json.loads(call["function"]["arguments"])["path"] == "batchtools/chunks.py"
        tok = await c.post("/tokenize", json={"messages": pi_request(task)["messages"], "tools": PI_TOOLS})
        assert tok.json()["tokens"] == body["prompt_token_ids"]
        text = (await c.post("/detokenize", json={"tokens": ids})).json()["prompt"]
        assert text.startswith("<tool_call>\n") and text.endswith("</tool_call><|im_end|>")


async def test_streamed_ids_concatenate_to_the_non_streamed_ones():
    task = bundled_tasks()[0]
    async with engine_client() as c:
        plain = (await c.post("/v1/chat/completions", json=pi_request(task))).json()
        r = await c.post(
            "/v1/chat/completions", json=pi_request(task, stream=True, stream_options={"include_usage": True})
        )
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["prompt_token_ids"] == plain["prompt_token_ids"]
    streamed = [i for ch in chunks for c in ch["choices"] for i in c.get("token_ids", [])]
    assert streamed == plain["choices"][0]["token_ids"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(streamed)
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "tool_calls"


async def test_template_renders_content_parts_null_content_and_tool_turns():
    task = bundled_tasks()[0]
    async with engine_client() as c:
        first = (await c.post("/v1/chat/completions", json=pi_request(task))).json()
        msg = first["choices"][0]["message"]
        messages = pi_request(task)["messages"] + [
            {"role": "assistant", "content": None, "tool_calls": msg["tool_calls"]},
            {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "Successfully replaced 1 block"},
        ]
        second = (await c.post("/v1/chat/completions", json=pi_request(task, messages=messages))).json()
        rendered = (await c.post("/detokenize", json={"tokens": second["prompt_token_ids"]})).json()["prompt"]
    assert "<tool_response>\nSuccessfully replaced 1 block\n</tool_response>" in rendered
    assert "None" not in rendered
    # The completion the engine sampled reappears verbatim in the next prompt (no re-serialisation drift here).
    prev = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(prev)] == prev
    assert second["choices"][0]["finish_reason"] == "stop"


async def test_engine_rejects_what_vllm_rejects():
    task = bundled_tasks()[0]
    async with engine_client() as c:
        assert (await c.post("/v1/chat/completions", json=pi_request(task, tools=[]))).status_code == 400
        assert (await c.post("/v1/chat/completions", json=pi_request(task, top_logprobs=21))).status_code == 400
        assert (await c.post("/v1/chat/completions", json=pi_request(task, max_tokens=9000))).status_code == 400
        assert (await c.post("/v1/chat/completions", json=pi_request(task, model="other"))).status_code == 404
        assert (await c.post("/v1/chat/completions", content=b"{not json")).status_code == 400
        models = (await c.get("/v1/models")).json()
        assert models["data"][0]["id"] == MODEL


async def test_max_tokens_truncates_with_finish_length():
    task = bundled_tasks()[0]
    async with engine_client() as c:
        body = (await c.post("/v1/chat/completions", json=pi_request(task, max_tokens=5))).json()
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == 5 and choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]  # as vLLM: the key only when there are calls


async def test_noop_and_script_policies(tmp_path):
    task = bundled_tasks()[0]
    async with engine_client("noop") as c:
        body = (await c.post("/v1/chat/completions", json=pi_request(task))).json()
    assert body["choices"][0]["message"]["content"] == "done"
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}, {"content": "all good"}])
    )
    async with engine_client(f"script:{script}") as c:
        body = (await c.post("/v1/chat/completions", json=pi_request(task))).json()
        call = body["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "bash" and json.loads(call["arguments"]) == {"command": "ls"}


def test_oracle_plans_from_the_gold_patch_with_each_tool_dialect():
    task = bundled_tasks()[0]
    ((path, old, new),) = _hunks(task.patch)
    assert path == "batchtools/chunks.py" and "len(items) // size" in old and "-(-len(items)" in new
    pi = OraclePolicy().plan(task, PI_TOOLS)
    assert pi[0].tool_calls[0][1]["edits"] == [{"oldText": old, "newText": new}]
    bash_only = OraclePolicy().plan(task, PI_TOOLS[:1])
    assert "git apply <<'SWE_GYM_PATCH_EOF'" in bash_only[0].tool_calls[0][1]["command"]
    assert pi[-1].content and not pi[-1].tool_calls
