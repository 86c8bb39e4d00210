"""The official clients over HTTP/2 (issue 50, decision 219): each given an HTTP/2-only
`httpx` client (cleartext with prior knowledge; the pytest gateway's listener takes `h2c`)."""
import anthropic
import httpx2 as httpx
import openai

MODEL = "llama-3.1-8b-instruct"


def h2() -> httpx.Client:
    return httpx.Client(http1=False, http2=True)


def test_the_openai_client_over_http2_on_every_route(gateway):
    base, key = gateway
    c = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, http_client=h2())
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert raw.http_response.http_version == "HTTP/2"
    assert raw.parse().choices[0].message.content == "tok0 tok1 tok2 tok3 tok4 "
    stream = c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-mock-tokens": "4"},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert text == "tok0 tok1 tok2 tok3 "
    assert usage.completion_tokens == 4
    r = c.responses.create(model=MODEL, input="hello", max_output_tokens=16)
    assert r.output_text.startswith("tok0")
    with c.responses.stream(model=MODEL, input="hello", max_output_tokens=16) as s:
        kinds = [event.type for event in s]
    assert kinds[-1] == "response.completed"
    assert MODEL in [m.id for m in c.models.list()]
    e = c.embeddings.create(model="bge-m3", input=["a", "b"])
    assert len(e.data) == 2
    try:
        openai.OpenAI(base_url=f"{base}/v1", api_key="rp_wrong", max_retries=0, http_client=h2()).models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError as err:
        assert err.body["code"] == "invalid_api_key"


def test_the_anthropic_client_over_http2(gateway):
    base, key = gateway
    c = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, http_client=h2())
    raw = c.messages.with_raw_response.create(model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "Hello"}])
    assert raw.http_response.http_version == "HTTP/2"
    m = raw.parse()
    assert m.content[0].text == "tok0 tok1 tok2 tok3 tok4 tok5 "
    with c.messages.stream(
        model=MODEL,
        max_tokens=50,
        messages=[{"role": "user", "content": "Slowly"}],
        extra_headers={"x-mock-tokens": "2", "x-mock-token-delay-ms": "900"},
    ) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "".join(b.text for b in final.content if b.type == "text") == "tok0 tok1 "
    n = c.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "count me"}])
    assert n.input_tokens > 0
