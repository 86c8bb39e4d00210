//! Every public route, asked the way the official clients ask, for tests that change how the
//! client connects (HTTP/2 cleartext and over TLS).

use serde_json::{Value, json};

use super::{Gateway, chat_body};

/// A request body for each generation route (`/v1/chat/completions`, `/v1/messages`,
/// `/v1/responses`) on `chat-model`.
pub fn body_for(route: &str, stream: bool) -> Value {
    match route {
        "/v1/messages" => json!({"model": "chat-model", "max_tokens": 64, "stream": stream,
                                 "messages": [{"role": "user", "content": "hi"}]}),
        "/v1/responses" => json!({"model": "chat-model", "input": "hi", "stream": stream}),
        _ => chat_body("chat-model", stream),
    }
}

/// Every route over `client` (which speaks HTTP/2), answered as over HTTP/1.1.
pub async fn every_route_answers(client: &reqwest::Client, base: &str, gw: &Gateway) {
    let post = |path: &str, body: Value| {
        client
            .post(format!("{base}{path}"))
            .header("authorization", gw.bearer())
            .header("x-api-key", &gw.key)
            .json(&body)
    };
    for stream in [false, true] {
        let r = post("/v1/chat/completions", chat_body("chat-model", stream)).send().await.unwrap();
        assert_eq!(r.version(), reqwest::Version::HTTP_2);
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        if stream {
            assert!(text.contains("\"content\":\"tok") && text.ends_with("data: [DONE]\n\n"), "{text}");
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["model"], "chat-model", "{v}");
            assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0, "{v}");
        }
        let messages = json!({"model": "chat-model", "max_tokens": 8, "stream": stream,
                              "messages": [{"role": "user", "content": "hi"}]});
        let r = post("/v1/messages", messages).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        if stream {
            assert!(text.starts_with("event: message_start") && text.contains("event: message_stop"), "{text}");
        } else {
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["type"], "message", "{text}");
        }
        let responses = json!({"model": "chat-model", "input": "hi", "stream": stream});
        let r = post("/v1/responses", responses).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        if stream {
            assert!(text.contains("response.completed"), "{text}");
        } else {
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["object"], "response", "{text}");
        }
    }
    let count = json!({"model": "chat-model", "messages": [{"role": "user", "content": "hello there"}]});
    let r = post("/v1/messages/count_tokens", count).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.json::<Value>().await.unwrap()["input_tokens"].as_u64().unwrap() > 0);
    // An error has the same envelope as over HTTP/1.1.
    let r =
        client.post(format!("{base}/v1/chat/completions")).json(&chat_body("chat-model", false)).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "invalid_api_key");
}
