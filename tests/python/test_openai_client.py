"""The official `openai` client, unchanged, pointed at {base}/v1."""
import time

import openai
import pytest

from conftest import admin_get

MODEL = "llama-3.1-8b-instruct"


def client(gateway) -> openai.OpenAI:
    base, key = gateway
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)


def test_non_streaming_completion(gateway):
    r = client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert r.object == "chat.completion"
    assert r.model == MODEL
    assert r.choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 "
    assert r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    extra = r.usage.model_extra
    assert extra["service"]["cost_microcents"] > 0
    assert abs(extra["cost"] - extra["service"]["cost_microcents"] / 1e8) < 1e-12


def stream_with_usage(gateway, headers):
    """A chat stream asking for usage, read to its end: (text, usage)."""
    stream = client(gateway).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers,
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    return text, usage


def test_streaming_completion_with_usage(gateway):
    text, usage = stream_with_usage(gateway, {"x-mock-tokens": "6"})
    assert text == "tok0 tok1 tok2 tok3 tok4 tok5 "
    assert usage is not None and usage.completion_tokens == 6


@pytest.mark.parametrize("after_done", ["cut", "hold"])
def test_streaming_completes_when_the_replica_body_does_not_end(gateway, after_done):
    # Decision 182: the replica sent [DONE], then cut the connection without the chunked
    # terminator or held it open; the client's iteration still ends without an error.
    text, usage = stream_with_usage(gateway, {"x-mock-tokens": "3", "x-mock-after-done": after_done})
    assert text == "tok0 tok1 tok2 "
    assert usage is not None and usage.completion_tokens == 3


def test_a_stream_ended_by_an_error_frame_leaves_the_connection_usable(gateway):
    # Decision 158 (issue 48): the replica cuts the stream mid-way, the gateway ends it with an
    # error frame; the client's next, unrelated request goes out on the connection it pooled
    # (requests one after another reuse the one idle connection) and must not find it closed.
    c = client(gateway)
    for _ in range(10):
        stream = c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello"}],
            stream=True,
            extra_headers={"x-mock-tokens": "8", "x-mock-abort-after": "3"},
        )
        with pytest.raises(openai.APIError) as e:
            for _chunk in stream:
                pass
        assert "model server" in str(e.value)
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "next"}], max_tokens=2)
        assert r.choices[0].message.content == "tok0 tok1 "


def test_streaming_reasoning_arrives_on_reasoning(gateway):
    stream = client(gateway).chat.completions.create(
        model="qwen3-32b",
        messages=[{"role": "user", "content": "think"}],
        stream=True,
        extra_headers={"x-mock-tokens": "4", "x-mock-reasoning": "2"},
    )
    reasoning = ""
    for chunk in stream:
        if chunk.choices:
            d = chunk.choices[0].delta
            reasoning += (d.model_extra or {}).get("reasoning") or ""
            assert "reasoning_content" not in (d.model_extra or {})
    assert reasoning == "think0 think1 "


def test_errors_raise_typed_exceptions_with_codes(gateway):
    c = client(gateway)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=5)
    assert e.value.code == "generation_count"
    assert e.value.request_id  # X-Request-Id


def test_models_list(gateway):
    ids = [m.id for m in client(gateway).models.list()]
    assert MODEL in ids


def test_wrong_key_is_an_authentication_error(gateway):
    base, _ = gateway
    bad = openai.OpenAI(base_url=f"{base}/v1", api_key="rp_" + "0" * 40, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.code == "invalid_api_key"


def test_retries_with_the_same_idempotency_key_run_and_bill_once(gateway):
    c = client(gateway)
    args = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "pay once"}],
        max_tokens=5,
        extra_headers={"Idempotency-Key": "py-retry-1"},
    )
    first = c.chat.completions.with_raw_response.create(**args)
    second = c.chat.completions.with_raw_response.create(**args)
    assert first.headers.get("x-service-idempotent-replay") is None
    assert second.headers.get("x-service-idempotent-replay") == "true"
    a, b = first.parse(), second.parse()
    assert b.id == a.id and b.choices[0].message.content == a.choices[0].message.content
    assert b.usage.model_extra["service"]["cost_microcents"] == a.usage.model_extra["service"]["cost_microcents"]
    # A different body under the same key is refused, typed as the client sees it.
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(**{**args, "max_tokens": 6})
    assert e.value.code == "idempotency_mismatch"


def test_plan_funding_headers_and_plan_paid_usage(plan_gateway):
    raw = client(plan_gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert raw.headers["x-service-funding"] == "plan"
    assert raw.headers["x-service-plan"] == "pro"
    assert 0 <= int(raw.headers["x-service-plan-5h-used-percent"]) <= 100
    assert int(raw.headers["x-service-plan-week-resets-at"]) > 0
    r = raw.parse()
    extra = r.usage.model_extra
    assert extra["cost"] == 0
    assert extra["service"]["cost_microcents"] == 0
    assert extra["service"]["paid_from"] == "plan"
    assert extra["service"]["plan_value_microcents"] > 0


def test_embeddings_are_served_and_billed_from_the_reported_usage(fresh_workspace):
    base, key, ws = fresh_workspace
    c = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    r = c.embeddings.create(model="bge-m3", input=["hello world", "goodbye"])
    assert [d.index for d in r.data] == [0, 1]
    assert r.usage.prompt_tokens > 0
    # bge-m3 costs $0.01 per million input tokens: one microcent a token (decision 153).
    deadline = time.time() + 5
    while True:
        ledger = admin_get(f"/admin/v1/workspaces/{ws}/ledger")
        settled = [e["cost_microcents"] for e in ledger["entries"] if e["kind"] == "settlement"]
        if settled or time.time() > deadline:
            break
        time.sleep(0.05)
    assert settled == [r.usage.prompt_tokens], ledger
    assert ledger["held_cents"] == 0
