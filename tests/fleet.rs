//! A fleet of gateways on one identity store (issue 52): what an operator sets through the
//! admin API on one instance is in force on every instance, and survives restarts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, Mock, Opts, chat_body};
use serde_json::json;

/// Ask `gw` for `model` until its status is `want`; how long that took. Generous bound: a slow
/// machine must not fail the test, and the figure is printed.
async fn until_status(gw: &Gateway, model: &str, want: u16) -> Duration {
    let start = Instant::now();
    loop {
        let r = gw.post("/v1/chat/completions", &chat_body(model, false), &[]).await;
        if r.status == want {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{model} still answers {} ({})", r.status, r.text);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pg_opts(url: &str) -> Opts {
    Opts { postgres_url: Some(url.to_string()), ..Opts::default() }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_sent_to_one_instance_refuses_the_model_on_both_and_survives_their_restart() {
    let mock = Mock::start();
    let url = common::pg::fresh_database().await;
    let (dir_a, dir_b) = (tmp_dir("a"), tmp_dir("b"));
    let mut a = Gateway::start_in(&mock, pg_opts(&url), dir_a.clone());
    let mut b = Gateway::start_in(&mock, pg_opts(&url), dir_b.clone());
    assert_eq!(b.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await.status, 200);

    let (s, v) = a.admin("POST", "/admin/v1/models/chat-model/pause", Some(json!({"until": "2099-01-01T00:00:00Z"})));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["availability"], "paused", "{v}");
    // In force at once on the instance that took the call ...
    let r = a.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    r.assert_error(503, "hosted_model_paused");
    // ... and on the other one within its next read of the shared states (every second).
    let took = until_status(&b, "chat-model", 503).await;
    println!("fleet: pause on a seen by b after {} ms", took.as_millis());
    let (_, health) = b.admin("GET", "/admin/v1/health", None);
    assert_eq!(health["model_states"]["status"], "ok", "{health}");
    assert_eq!(health["model_states"]["models"]["chat-model"]["paused_until"], "2099-01-01T00:00:00Z", "{health}");

    // Both restart: the pause is the store's, not a process's.
    a.kill();
    b.kill();
    // Not dropped: a drop removes the folder the restarted instances use.
    std::mem::forget((a, b));
    let a = Gateway::start_in(&mock, pg_opts(&url), dir_a);
    let b = Gateway::start_in(&mock, pg_opts(&url), dir_b);
    for gw in [&a, &b] {
        let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
        r.assert_error(503, "hosted_model_paused");
        let listed = gw.get("/v1/models").await.json();
        let entry = listed["data"].as_array().unwrap().iter().find(|m| m["id"] == "chat-model").cloned().unwrap();
        assert_eq!(entry["availability"], "paused", "{entry}");
    }

    // A resume on b serves the model again on a; a resume of a model models.yaml pauses
    // overrides the file on both.
    let (s, v) = b.admin("POST", "/admin/v1/models/chat-model/resume", None);
    assert_eq!(s, 200, "{v}");
    let (s, v) = b.admin("POST", "/admin/v1/models/paused-model/resume", None);
    assert_eq!(s, 200, "{v}");
    let took = until_status(&a, "chat-model", 200).await;
    println!("fleet: resume on b seen by a after {} ms", took.as_millis());
    until_status(&a, "paused-model", 200).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_single_node_on_sqlite_keeps_an_operator_pause_across_a_restart() {
    let mock = Mock::start();
    let dir = tmp_dir("one");
    let mut gw = Gateway::start_in(&mock, Opts::default(), dir.clone());
    let (s, v) = gw.admin("POST", "/admin/v1/models/chat-model/pause", Some(json!({"until": "2099-01-01T00:00:00Z"})));
    assert_eq!(s, 200, "{v}");
    // An unknown model and a bad time change nothing.
    let (s, _) =
        gw.admin("POST", "/admin/v1/models/no-such-model/pause", Some(json!({"until": "2099-01-01T00:00:00Z"})));
    assert_eq!(s, 404);
    let (s, v) = gw.admin("POST", "/admin/v1/models/stream-model/pause", Some(json!({"until": "soon"})));
    assert_eq!(s, 400, "{v}");
    gw.kill();
    std::mem::forget(gw); // its folder holds the SQLite store the restart reads

    let gw = Gateway::start_in(&mock, Opts::default(), dir);
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    r.assert_error(503, "hosted_model_paused");
    assert_eq!(gw.post("/v1/chat/completions", &chat_body("stream-model", false), &[]).await.status, 200);
    let (_, health) = gw.admin("GET", "/admin/v1/health", None);
    let states = &health["model_states"]["models"];
    assert!(states.get("stream-model").is_none(), "a refused pause left a row: {health}");
}

fn tmp_dir(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tollgate-fleet-{}-{tag}-{}", std::process::id(), common::free_port()))
}
