//! Session affinity through the running gateway with three mock replicas: a session stays on
//! one replica turn after turn, sessions spread, the identity never reaches a replica or the
//! log, the session headers are stripped, a full or dead preferred replica still serves, the
//! opening messages place a conversation without an identity, and two instances agree.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

struct Three {
    mocks: Vec<Mock>,
}

impl Three {
    fn start() -> Three {
        Three { mocks: (0..3).map(|_| Mock::start()).collect() }
    }

    fn addrs(&self) -> Vec<String> {
        self.mocks.iter().map(Mock::addr).collect()
    }

    /// Requests each replica received so far.
    async fn counts(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for m in &self.mocks {
            out.push(m.stats().await["requests"].as_u64().unwrap());
        }
        out
    }
}

fn opts(replicas: Vec<String>, concurrency: u32) -> Opts {
    Opts { chat_replicas: replicas, chat_concurrency: concurrency, ..Opts::default() }
}

fn turn(n: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "start"})];
    for i in 1..n {
        messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
        messages.push(json!({"role": "user", "content": format!("question {i}")}));
    }
    json!({"model": "chat-model", "messages": messages, "max_tokens": 4})
}

/// The gateway's log once it holds `needle` (the access line is written after the answer).
async fn log_with(gw: &Gateway, needle: &str) -> String {
    for _ in 0..40 {
        let log = gw.log();
        if log.contains(needle) {
            return log;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("no `{needle}` in the log: {}", gw.log())
}

fn delta(before: &[u64], after: &[u64]) -> Vec<u64> {
    before.iter().zip(after).map(|(b, a)| a - b).collect()
}

#[tokio::test]
async fn a_session_stays_on_one_replica_for_twenty_turns_and_sessions_spread() {
    let three = Three::start();
    let gw = Gateway::start_with(&three.mocks[0], opts(three.addrs(), 64));
    let before = three.counts().await;
    for n in 1..=20 {
        let r = gw.post("/v1/chat/completions", &turn(n), &[("x-session-id", "conversation-alpha")]).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let d = delta(&before, &three.counts().await);
    assert_eq!(d.iter().filter(|&&c| c == 20).count(), 1, "all 20 turns on one replica: {d:?}");

    // Twelve sessions do not all land on one replica.
    let before = three.counts().await;
    for s in 0..12 {
        let id = format!("session-{s}");
        let r = gw.post("/v1/chat/completions", &turn(1), &[("x-session-id", id.as_str())]).await;
        assert_eq!(r.status, 200);
    }
    let d = delta(&before, &three.counts().await);
    assert!(d.iter().filter(|&&c| c > 0).count() >= 2, "sessions spread: {d:?}");
}

#[tokio::test]
async fn the_identity_never_reaches_a_replica_or_the_log() {
    let three = Three::start();
    let gw = Gateway::start_with(&three.mocks[0], opts(three.addrs(), 64));
    let secret = "sess-9f2c-private";
    let mut body = turn(1);
    body["service"] = json!({"sessionId": secret});
    body["prompt_cache_key"] = json!("pck-private");
    body["user"] = json!("end-user-7");
    let headers = [
        ("x-session-id", secret),
        ("x-agent1-session-id", secret),
        ("x-agent1-agent-id", "sub"),
        ("thread-id", secret),
        ("x-agent3-window-id", "w"),
        ("x-parent-session-id", secret),
    ];
    let r = gw.post("/v1/chat/completions", &body, &headers).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let mut seen = None;
    for m in &three.mocks {
        if m.stats().await["requests"].as_u64().unwrap() > 0 {
            seen = Some(m.last_request().await);
        }
    }
    let seen = seen.expect("one replica served it");
    let text = seen.to_string();
    assert!(!text.contains(secret) && !text.contains("pck-private"), "identity forwarded: {text}");
    for h in common_session_headers() {
        assert!(seen["headers"].get(h).is_none(), "{h} forwarded");
    }
    assert_eq!(seen["body"]["user"], "end-user-7", "`user` reaches the model unchanged");
    let log = log_with(&gw, "placed=session").await;
    assert!(!log.contains(secret), "identity logged");
}

fn common_session_headers() -> [&'static str; 6] {
    [
        "x-session-id",
        "x-agent1-session-id",
        "x-agent1-agent-id",
        "thread-id",
        "x-agent3-window-id",
        "x-parent-session-id",
    ]
}

#[tokio::test]
async fn a_full_or_dead_preferred_replica_still_serves() {
    let three = Three::start();
    // One slot per replica: a slow request fills a session's preferred replica.
    let gw = Gateway::start_with(&three.mocks[0], opts(three.addrs(), 1));
    let h = [("x-session-id", "busy-session")];
    let (body, slow) = (turn(1), [h[0], ("x-mock-ttft-ms", "1000")]);
    let first = gw.post("/v1/chat/completions", &body, &slow);
    let second = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        gw.post("/v1/chat/completions", &turn(2), &h).await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!((first.status, second.status), (200, 200), "{}", second.text);
    let d = three.counts().await;
    assert_eq!(d.iter().filter(|&&c| c == 1).count(), 2, "the second turn spilled to another replica: {d:?}");
    log_with(&gw, "placed=session+spill").await;

    // A dead replica among the three: every session is still served.
    let dead = format!("127.0.0.1:{}", closed_port());
    let addrs = vec![three.addrs()[0].clone(), dead, three.addrs()[1].clone()];
    let gw = Gateway::start_with(&three.mocks[0], opts(addrs, 64));
    for s in 0..9 {
        let id = format!("s{s}");
        let r = gw.post("/v1/chat/completions", &turn(1), &[("x-session-id", id.as_str())]).await;
        assert_eq!(r.status, 200, "session {s}: {}", r.text);
    }
}

#[tokio::test]
async fn without_an_identity_the_opening_messages_keep_a_conversation_together() {
    let three = Three::start();
    let gw = Gateway::start_with(&three.mocks[0], opts(three.addrs(), 64));
    let before = three.counts().await;
    for n in 1..=8 {
        let r = gw.post("/v1/chat/completions", &turn(n), &[]).await;
        assert_eq!(r.status, 200);
    }
    let d = delta(&before, &three.counts().await);
    assert_eq!(d.iter().filter(|&&c| c == 8).count(), 1, "one conversation, one replica: {d:?}");
    log_with(&gw, "placed=opening").await;
}

#[tokio::test]
async fn two_instances_place_a_session_on_the_same_replica() {
    let url = pg::fresh_database().await;
    let three = Three::start();
    let o = |u: &str| Opts { postgres_url: Some(u.to_string()), ..opts(three.addrs(), 64) };
    let a = Gateway::start_with(&three.mocks[0], o(&url));
    let b = Gateway::start_with(&three.mocks[0], o(&url));
    let before = three.counts().await;
    for n in 1..=6 {
        let gw = if n % 2 == 0 { &a } else { &b };
        let auth = format!("Bearer {}", a.key);
        let r = gw
            .post_as("/v1/chat/completions", &turn(n), &[("authorization", auth.as_str()), ("x-affinity", "shared")])
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let d = delta(&before, &three.counts().await);
    assert_eq!(d.iter().filter(|&&c| c == 6).count(), 1, "both instances chose one replica: {d:?}");
}

#[tokio::test]
async fn a_session_keeps_its_replica_across_dialects_streaming_or_not() {
    let three = Three::start();
    let gw = Gateway::start_with(&three.mocks[0], opts(three.addrs(), 64));
    let before = three.counts().await;
    let h = [("x-session-id", "tri-dialect"), ("anthropic-version", "2023-06-01")];
    let msg = json!({"model": "chat-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let mut msg_stream = msg.clone();
    msg_stream["stream"] = json!(true);
    let mut chat_stream = turn(2);
    chat_stream["stream"] = json!(true);
    let resp = json!({"model": "chat-model", "input": "hi", "max_output_tokens": 8});
    let calls = [
        ("/v1/chat/completions", turn(1)),
        ("/v1/chat/completions", chat_stream),
        ("/v1/messages", msg),
        ("/v1/messages", msg_stream),
        ("/v1/responses", resp),
    ];
    for (path, body) in &calls {
        let r = gw.post(path, body, &h).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text);
        assert!(r.header("x-session-id").is_none(), "no session header comes back");
    }
    let d = delta(&before, &three.counts().await);
    assert_eq!(d.iter().filter(|&&c| c == 5).count(), 1, "one replica for the session on every dialect: {d:?}");
}

/// Which replica served one request (by the mocks' counters).
async fn served_by(three: &Three, gw: &Gateway, n: usize, session: &str) -> usize {
    let before = three.counts().await;
    let r = gw.post("/v1/chat/completions", &turn(n), &[("x-session-id", session)]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let d = delta(&before, &three.counts().await);
    d.iter().position(|&c| c == 1).unwrap_or_else(|| panic!("no single replica served it: {d:?}"))
}

#[tokio::test]
async fn a_spill_that_persists_moves_the_session_until_it_idles_past_the_ttl() {
    let three = Three::start();
    let gw = Gateway::start_with(&three.mocks[0], Opts { affinity_ttl_seconds: 4, ..opts(three.addrs(), 1) });
    let home = served_by(&three, &gw, 1, "mover").await;
    // The session's own slow turn holds its home replica (one slot each) ...
    let slow = async {
        let h = [("x-session-id", "mover"), ("x-mock-ttft-ms", "2500")];
        gw.post("/v1/chat/completions", &turn(2), &h).await
    };
    // ... while three more turns in a row run elsewhere: the third moves the session.
    let spills = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let mut ran = Vec::new();
        for n in 3..=5 {
            ran.push(served_by(&three, &gw, n, "mover").await);
        }
        ran
    };
    let (slow, ran) = tokio::join!(slow, spills);
    assert_eq!(slow.status, 200);
    assert!(ran.iter().all(|&r| r != home), "home was full: {ran:?} vs {home}");
    let moved = ran[2];
    // The home replica is free again, but the session now lives where it moved.
    assert_eq!(served_by(&three, &gw, 6, "mover").await, moved, "moved after three spills in a row");
    log_with(&gw, "placed=session+spill").await;
    // Idle past the TTL: the stored placement is forgotten and hashing places it home again.
    tokio::time::sleep(std::time::Duration::from_millis(4_500)).await;
    assert_eq!(served_by(&three, &gw, 7, "mover").await, home, "forgotten after the idle TTL");
}

#[tokio::test]
async fn two_instances_on_one_redis_share_a_moved_session() {
    let url = pg::fresh_database().await;
    let three = Three::start();
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let limits = format!(
        "  store: {{ backend: redis, url: \"{redis}\", prefix: tollgate-aff-{}-{} }}\n",
        std::process::id(),
        jiff::Timestamp::now().as_millisecond()
    );
    let o = || Opts { postgres_url: Some(url.clone()), limits: Some(limits.clone()), ..opts(three.addrs(), 1) };
    let a = Gateway::start_with(&three.mocks[0], o());
    let mut b = Gateway::start_with(&three.mocks[0], o());
    b.key = a.key.clone(); // one workspace, one key, on the shared identity store
    let home = served_by(&three, &a, 1, "shared-mover").await;
    assert_eq!(served_by(&three, &b, 2, "shared-mover").await, home, "both instances agree");
    // Moved through instance a (its home busy for three turns in a row) ...
    let slow = async {
        let h = [("x-session-id", "shared-mover"), ("x-mock-ttft-ms", "2000")];
        a.post("/v1/chat/completions", &turn(3), &h).await
    };
    let spills = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let mut ran = Vec::new();
        for n in 4..=6 {
            ran.push(served_by(&three, &a, n, "shared-mover").await);
        }
        ran
    };
    let (slow, ran) = tokio::join!(slow, spills);
    assert_eq!(slow.status, 200);
    // ... instance b places it where it moved.
    assert_eq!(served_by(&three, &b, 7, "shared-mover").await, ran[2], "the move is shared through Redis");
}

#[tokio::test]
async fn metrics_count_placements_by_kind() {
    let three = Three::start();
    let gw = Gateway::start_with(&three.mocks[0], opts(three.addrs(), 64));
    served_by(&three, &gw, 1, "metered").await;
    served_by(&three, &gw, 2, "metered").await;
    let r = gw.post("/v1/chat/completions", &turn(1), &[]).await;
    assert_eq!(r.status, 200);
    let line = |text: &str, by: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("tollgate_placements_total")
                    && l.contains(&format!("by=\"{by}\""))
                    && l.contains("spill=\"false\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    let mut text = String::new();
    for _ in 0..20 {
        text = gw.metrics().await;
        if line(&text, "opening").is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(line(&text, "session"), Some(2), "{text}");
    assert_eq!(line(&text, "opening"), Some(1), "{text}");
    assert!(!text.contains("metered"), "no identity in the metrics");
}

/// One request with these session headers (and body fields), on the replica it ran on.
async fn placed_with(three: &Three, gw: &Gateway, headers: &[(&str, &str)], service: Option<&str>) -> usize {
    let mut body = turn(1);
    body["messages"][0]["content"] = json!("same opening everywhere");
    if let Some(s) = service {
        body["service"] = json!({"sessionId": s});
    }
    let before = three.counts().await;
    let r = gw.post("/v1/chat/completions", &body, headers).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let d = delta(&before, &three.counts().await);
    d.iter().position(|&c| c == 1).unwrap()
}

#[tokio::test]
async fn every_identity_source_wins_over_the_ones_below_it_and_invalid_ones_are_skipped() {
    let three = Three::start();
    let gw = Gateway::start_with(&three.mocks[0], opts(three.addrs(), 64));
    let window = ("x-agent3-window-id", "w");
    // In the spec's order (body `service.sessionId` first, handled apart).
    let sources = [
        "x-service-session",
        "x-session-id",
        "x-agent1-session-id",
        "x-agent2-session-id",
        "x-session-affinity",
        "x-affinity",
        "thread-id",
        "session-id",
        "x-parent-session-id",
    ];
    for value in ["alpha", "bravo", "charlie", "delta"] {
        // The body's own session beats every header.
        let all: Vec<(&str, &str)> = sources.iter().map(|h| (*h, "lower")).chain([window]).collect();
        let alone = placed_with(&three, &gw, &[], Some(value)).await;
        assert_eq!(placed_with(&three, &gw, &all, Some(value)).await, alone, "service.sessionId={value}");
        for (i, h) in sources.iter().enumerate() {
            // Source i with `value`, every source below it with other values: i decides.
            let mut hs: Vec<(&str, &str)> = vec![(h, value), window];
            hs.extend(sources[i + 1..].iter().map(|l| (*l, "lower")));
            let alone = placed_with(&three, &gw, &[(h, value), window], None).await;
            assert_eq!(placed_with(&three, &gw, &hs, None).await, alone, "{h}={value}");
            // An invalid candidate above it (blank, or a bad service shape) does not mask it.
            let mut masked = hs.clone();
            masked.push(("x-service-session", "bad shape!"));
            if *h != "x-service-session" {
                assert_eq!(placed_with(&three, &gw, &masked, None).await, alone, "{h} under an invalid candidate");
            }
        }
    }
}

#[tokio::test]
async fn the_same_value_in_two_namespaces_names_two_sessions() {
    let three = Three::start();
    let gw = Gateway::start_with(&three.mocks[0], opts(three.addrs(), 64));
    // Clarification 14: the generic headers share one namespace, each agent family has its own.
    let mut differ = 0;
    // Twelve values: all twelve agreeing by chance has a probability of (1/3)^12.
    for value in ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10", "n11", "n12"] {
        let generic = placed_with(&three, &gw, &[("x-session-id", value)], None).await;
        assert_eq!(placed_with(&three, &gw, &[("x-affinity", value)], None).await, generic, "one generic namespace");
        let agent = placed_with(&three, &gw, &[("x-agent2-session-id", value)], None).await;
        differ += usize::from(agent != generic);
    }
    assert!(differ > 0, "an agent namespace is apart from the generic one");
}
