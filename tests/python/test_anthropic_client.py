"""The official `anthropic` client, unchanged, with the bare {base} as its base URL."""
import anthropic
import pytest


def client(gateway) -> anthropic.Anthropic:
    base, key = gateway
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)


def test_messages_create(gateway):
    m = client(gateway).messages.create(
        model="llama-3.1-8b-instruct", max_tokens=6, messages=[{"role": "user", "content": "Hello"}]
    )
    assert m.type == "message"
    assert m.content[0].type == "text"
    assert m.content[0].text == "tok0 tok1 tok2 tok3 tok4 tok5 "
    assert m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == 6


def test_messages_stream_with_thinking(gateway):
    c = client(gateway)
    with c.messages.stream(
        model="qwen3-32b",
        max_tokens=50,
        messages=[{"role": "user", "content": "Think"}],
        extra_headers={"x-mock-reasoning": "2", "x-mock-tokens": "4"},
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok2 tok3 "
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "think0 think1 "
    assert final.content[0].signature


def test_messages_stream_survives_heartbeat_pings(gateway):
    c = client(gateway)
    events = []
    with c.messages.stream(
        model="llama-3.1-8b-instruct",
        max_tokens=50,
        messages=[{"role": "user", "content": "Slowly"}],
        extra_headers={"x-mock-tokens": "2", "x-mock-token-delay-ms": "900"},
    ) as stream:
        for event in stream:
            events.append(event.type)
        final = stream.get_final_message()
    # The SDK drops `ping` events itself (tests/dialects.rs shows they are sent); what this
    # checks is that a stream with pings in its silences parses to the right message.
    assert events[0] == "message_start"
    assert events[-1] == "message_stop"
    assert "".join(b.text for b in final.content if b.type == "text") == "tok0 tok1 "


@pytest.mark.parametrize("after_done", ["cut", "hold"])
def test_messages_stream_completes_when_the_replica_body_does_not_end(gateway, after_done):
    # Decision 182: the replica ended its stream, then cut the connection without the chunked
    # terminator or held it open; the client still gets a complete stream, not an error.
    c = client(gateway)
    with c.messages.stream(
        model="llama-3.1-8b-instruct",
        max_tokens=50,
        messages=[{"role": "user", "content": "Hi"}],
        extra_headers={"x-mock-tokens": "3", "x-mock-after-done": after_done},
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok0 tok1 tok2 "
    assert final.stop_reason == "end_turn"


def test_count_tokens(gateway):
    r = client(gateway).messages.count_tokens(
        model="llama-3.1-8b-instruct", messages=[{"role": "user", "content": "count me"}]
    )
    assert r.input_tokens > 0


def test_errors_are_typed(gateway):
    with pytest.raises(anthropic.NotFoundError):
        client(gateway).messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError):
        base, _ = gateway
        anthropic.Anthropic(base_url=base, api_key="rp_" + "1" * 40, max_retries=0).messages.create(
            model="llama-3.1-8b-instruct", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )


def test_plan_funding_headers_and_plan_paid_usage(plan_gateway):
    raw = client(plan_gateway).messages.with_raw_response.create(
        model="llama-3.1-8b-instruct", max_tokens=6, messages=[{"role": "user", "content": "Hello"}]
    )
    assert raw.headers["x-service-funding"] == "plan"
    assert raw.headers["x-service-plan"] == "pro"
    m = raw.parse()
    assert m.usage.output_tokens == 6
    extra = m.usage.model_extra
    assert extra["cost"] == 0
    assert extra["service"]["paid_from"] == "plan"
    assert extra["service"]["plan_value_microcents"] > 0
