//! Request traces (issue 52): a client's `traceparent` is continued at the replica, and a
//! sampled request's spans (the request with the GenAI attributes, admission, the ledger
//! hold, the replica call) reach an OTLP/HTTP receiver run inside the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Gateway, Mock, Opts, chat_body};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An OTLP/HTTP receiver: every span of every export it was sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    exports: Arc<Mutex<usize>>,
}

impl Receiver {
    async fn start() -> (Receiver, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = Receiver::default();
        let r = me.clone();
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else { return };
                tokio::spawn(r.clone().serve(sock));
            }
        });
        (me, port)
    }

    /// HTTP/1.1 with Content-Length bodies, keep-alive: what the exporter's client sends.
    async fn serve(self, mut sock: tokio::net::TcpStream) {
        let mut buf = Vec::new();
        loop {
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 8192];
                match sock.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            assert!(head.starts_with("post /v1/traces "), "{head}");
            assert!(head.contains("content-type: application/x-protobuf"), "{head}");
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .expect("a Content-Length body");
            while buf.len() < head_end + len {
                let mut chunk = [0u8; 65536];
                match sock.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body: Vec<u8> = buf.drain(..head_end + len).skip(head_end).collect();
            let export = ExportTraceServiceRequest::decode(body.as_slice()).expect("an OTLP protobuf export");
            for rs in export.resource_spans {
                let service = rs
                    .resource
                    .as_ref()
                    .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name").and_then(|a| a.value.clone()));
                assert!(
                    matches!(service.and_then(|v| v.value), Some(AnyValue::StringValue(s)) if s == "tollgate-test"),
                    "the resource names the service"
                );
                for ss in rs.scope_spans {
                    self.spans.lock().unwrap().extend(ss.spans);
                }
            }
            *self.exports.lock().unwrap() += 1;
            let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
            if sock.write_all(answer).await.is_err() {
                return;
            }
        }
    }

    /// The spans of trace `trace_id` once `n` of them arrived.
    async fn trace(&self, trace_id: &[u8], n: usize) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans: Vec<Span> =
                self.spans.lock().unwrap().iter().filter(|s| s.trace_id == trace_id).cloned().collect();
            if spans.len() >= n {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} spans of the trace arrived: {:?}",
                spans.len(),
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn count(&self) -> usize {
        self.spans.lock().unwrap().len()
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| a.value.as_ref()).and_then(|v| v.value.as_ref())
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(AnyValue::IntValue(i)) => *i,
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}

fn text(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        other => panic!("{key} is {other:?} on {}", span.name),
    }
}

fn traced_gateway(mock: &Mock, port: u16, ratio: f64) -> Gateway {
    let opts = Opts {
        limits: Some(String::new()),
        extra_yaml: format!(
            "tracing:\n  otlp_endpoint: http://127.0.0.1:{port}/v1/traces\n  sample_ratio: {ratio}\n  service_name: tollgate-test\n"
        ),
        ..Opts::default()
    };
    Gateway::start_with(mock, opts)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sampled_request_exports_its_spans_and_the_replica_continues_the_clients_trace() {
    let (receiver, port) = Receiver::start().await;
    let mock = Mock::start();
    // Nothing is sampled by the ratio: only the client's sampled flag exports.
    let gw = traced_gateway(&mock, port, 0.0);
    let trace_hex = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_hex = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_hex}-{parent_hex}-01");
    let mut body = chat_body("pricey-model", false);
    body["max_tokens"] = serde_json::json!(20);
    let r = gw.post("/v1/chat/completions", &body, &[("traceparent", &traceparent), ("x-mock-tokens", "5")]).await;
    assert_eq!(r.status, 200, "{}", r.text);

    // The replica continues the client's trace, under the gateway's span.
    let seen = mock.last_request().await;
    let header = seen["headers"]["traceparent"].as_str().unwrap().to_string();
    let fields: Vec<&str> = header.split('-').collect();
    assert_eq!((fields[0], fields[1], fields[3]), ("00", trace_hex, "01"), "{header}");
    assert_ne!(fields[2], parent_hex, "the replica's parent is the gateway's replica-call span");

    let trace_id = hex_bytes(trace_hex);
    let spans = receiver.trace(&trace_id, 4).await;
    let named =
        |name: &str| spans.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name} span in {spans:?}"));
    let request = named("chat pricey-model");
    assert_eq!(request.parent_span_id, hex_bytes(parent_hex), "the request span continues the client's");
    assert_eq!(request.kind, 2, "SERVER");
    assert_eq!(text(request, "gen_ai.operation.name"), "chat");
    assert_eq!(text(request, "gen_ai.request.model"), "pricey-model");
    assert_eq!(int(request, "gen_ai.usage.output_tokens"), 5);
    assert!(int(request, "gen_ai.usage.input_tokens") > 0);
    match attr(request, "gen_ai.response.finish_reasons") {
        Some(AnyValue::ArrayValue(a)) => {
            let reasons: Vec<_> = a.values.iter().filter_map(|v| v.value.clone()).collect();
            assert_eq!(reasons, vec![AnyValue::StringValue("stop".into())]);
        }
        other => panic!("finish reasons: {other:?}"),
    }
    assert_eq!(int(request, "http.response.status_code"), 200);
    let mock_port = mock.addr().rsplit(':').next().unwrap().parse::<i64>().unwrap();
    assert_eq!(text(request, "server.address"), "127.0.0.1");
    assert_eq!(int(request, "server.port"), mock_port);

    let replica_call = named("POST /v1/chat/completions");
    assert_eq!(replica_call.kind, 3, "CLIENT");
    assert_eq!(replica_call.parent_span_id, request.span_id);
    assert_eq!(hex::encode(&replica_call.span_id), fields[2], "the replica's parent is this span");
    assert_eq!(int(replica_call, "server.port"), mock_port);
    for phase in ["admission", "ledger hold"] {
        let span = named(phase);
        assert_eq!(span.parent_span_id, request.span_id, "{phase}");
        assert!(span.start_time_unix_nano >= request.start_time_unix_nano, "{phase} inside the request");
        assert!(span.end_time_unix_nano <= replica_call.start_time_unix_nano + 1_000_000, "{phase} before the call");
    }
    assert!(request.end_time_unix_nano >= replica_call.end_time_unix_nano);
}

#[tokio::test(flavor = "multi_thread")]
async fn unsampled_requests_export_nothing_but_still_carry_the_trace_to_the_replica() {
    let (receiver, port) = Receiver::start().await;
    let mock = Mock::start();
    let gw = traced_gateway(&mock, port, 0.0);
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    for _ in 0..5 {
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[("traceparent", traceparent)]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let seen = mock.last_request().await;
    let header = seen["headers"]["traceparent"].as_str().unwrap().to_string();
    assert!(header.starts_with("00-0af7651916cd43dd8448eb211c80319c-") && header.ends_with("-00"), "{header}");
    // Without a traceparent and at ratio 0, nothing either.
    for _ in 0..5 {
        assert_eq!(gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await; // past the batch delay (500 ms)
    assert_eq!(receiver.count(), 0, "an unsampled request was exported");

    // At ratio 1 every request is, with a trace of its own.
    let (receiver, port) = Receiver::start().await;
    let gw = traced_gateway(&mock, port, 1.0);
    for _ in 0..3 {
        assert_eq!(gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await.status, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.count() < 3 * 4 {
        assert!(Instant::now() < deadline, "{} spans of 3 requests", receiver.count());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spans = receiver.spans.lock().unwrap().clone();
    let traces: std::collections::HashSet<_> = spans.iter().map(|s| s.trace_id.clone()).collect();
    assert_eq!(traces.len(), 3, "one trace per request");
}

fn hex_bytes(h: &str) -> Vec<u8> {
    hex::decode(h).unwrap()
}
