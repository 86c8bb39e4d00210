//! Authentication through the running gateway, on every route class, and the admin API's
//! own rules (token, validation, key operations), on SQLite and on PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{Value, json};

const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/messages"),
    ("GET", "/v1/models"),
    ("GET", "/v1/credits"),
    ("GET", "/v1/usage"),
];

async fn call(gw: &Gateway, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    if method == "GET" {
        gw.get_as(path, headers).await
    } else {
        gw.post_as(path, &chat_body("chat-model", false), headers).await
    }
}

/// (status, code or messages type) of an error reply, whichever envelope it is in.
fn outcome(r: &Reply) -> (u16, String, String) {
    let v = r.json();
    let code = v["error"]["code"].as_str().unwrap_or("").to_string();
    let message = v["error"]["message"].as_str().unwrap_or("").to_string();
    (r.status, code, message)
}

#[tokio::test]
async fn missing_malformed_unknown_keys_are_401_on_every_route() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let unknown = format!("Bearer rp_{}", "z".repeat(40));
    for (method, path) in ROUTES {
        for headers in [vec![], vec![("authorization", "Bearer nope")], vec![("authorization", unknown.as_str())]] {
            let r = call(&gw, method, path, &headers).await;
            assert_eq!(r.status, 401, "{method} {path} {headers:?}: {}", r.text);
            let v = r.json();
            if path.contains("messages") {
                assert_eq!(v["error"]["type"], "authentication_error");
                assert!(v["error"].get("code").is_none());
            } else {
                assert_eq!(v["error"]["code"], "invalid_api_key");
                assert_eq!(v["error"]["type"], "authentication_error");
            }
        }
    }
    assert_eq!(mock.stats().await["requests"], 0);
}

#[tokio::test]
async fn x_api_key_counts_on_messages_and_model_reads_only() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let r = gw.get_as("/v1/models", &[("x-api-key", &gw.key)]).await;
    assert_eq!(r.status, 200);
    // A non-blank x-api-key wins over Bearer there.
    let r = gw.get_as("/v1/models", &[("x-api-key", &gw.key), ("authorization", "Bearer wrong")]).await;
    assert_eq!(r.status, 200);
    let r = gw.get_as("/v1/models", &[("x-api-key", "wrong"), ("authorization", &gw.bearer())]).await;
    assert_eq!(r.status, 401);
    let r = gw.get_as("/v1/models", &[("x-api-key", "  "), ("authorization", &gw.bearer())]).await;
    assert_eq!(r.status, 200, "a blank x-api-key does not win");
    // Chat completions read Bearer only.
    let r = gw.post_as("/v1/chat/completions", &chat_body("chat-model", false), &[("x-api-key", &gw.key)]).await;
    assert_eq!(r.status, 401);
}

#[tokio::test]
async fn lifecycle_outcomes_through_the_gateway() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let ws = gw.workspace.clone();
    let chat = |key: String| {
        let gw = &gw;
        async move {
            let bearer = format!("Bearer {key}");
            gw.post_as("/v1/chat/completions", &chat_body("chat-model", false), &[("authorization", &bearer)]).await
        }
    };
    // Revoked: 403 auth_error "API key is deactivated", and it stays so.
    let k = gw.mint_key(&ws, json!({}));
    let (s, _) = gw.admin("POST", &format!("/admin/v1/keys/{}/revoke", k["id"].as_str().unwrap()), None);
    assert_eq!(s, 200);
    for _ in 0..2 {
        let r = chat(k["key"].as_str().unwrap().into()).await;
        assert_eq!(outcome(&r), (403, "auth_error".into(), "API key is deactivated".into()));
        assert_eq!(r.json()["error"]["type"], "authentication_error");
    }
    // Deleted: 401 "Invalid API key".
    let k = gw.mint_key(&ws, json!({}));
    let (s, _) = gw.admin("DELETE", &format!("/admin/v1/keys/{}", k["id"].as_str().unwrap()), None);
    assert_eq!(s, 204);
    let r = chat(k["key"].as_str().unwrap().into()).await;
    assert_eq!(outcome(&r), (401, "invalid_api_key".into(), "Invalid API key".into()));
    // Expired at the instant it passes: 401 "API key has expired".
    let soon = jiff::Timestamp::now() + jiff::SignedDuration::from_millis(1200);
    let k = gw.mint_key(&ws, json!({ "expires_at": soon.to_string() }));
    assert_eq!(chat(k["key"].as_str().unwrap().into()).await.status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(1400)).await;
    let r = chat(k["key"].as_str().unwrap().into()).await;
    assert_eq!(outcome(&r), (401, "invalid_api_key".into(), "API key has expired".into()));
    // An expired key never comes back: no new expiry, none cleared (decision 167).
    let patch = format!("/admin/v1/keys/{}", k["id"].as_str().unwrap());
    for revive in [json!({"expires_at": "2099-01-01T00:00:00Z"}), json!({"expires_at": null})] {
        let (s, v) = gw.admin("PATCH", &patch, Some(revive.clone()));
        assert_eq!((s, v["code"].as_str()), (409, Some("api_key_not_active")), "{revive}: {v}");
    }
    let r = chat(k["key"].as_str().unwrap().into()).await;
    assert_eq!(outcome(&r), (401, "invalid_api_key".into(), "API key has expired".into()));
    // Nor does a live key take an expiry in the past (as on create).
    let live = gw.mint_key(&ws, json!({}));
    let (s, v) = gw.admin(
        "PATCH",
        &format!("/admin/v1/keys/{}", live["id"].as_str().unwrap()),
        Some(json!({"expires_at": "2001-01-01T00:00:00Z"})),
    );
    assert_eq!(s, 400, "{v}");
    assert!(v.to_string().contains("expires_at"), "{v}");
    assert_eq!(chat(live["key"].as_str().unwrap().into()).await.status, 200, "the refused patch changed nothing");
    // Rotation grace ends on time, then the previous key answers like a revoked one.
    let k = gw.mint_key(&ws, json!({}));
    let (s, rotated) = gw.admin(
        "POST",
        &format!("/admin/v1/keys/{}/rotate", k["id"].as_str().unwrap()),
        Some(json!({"grace_seconds": 1})),
    );
    assert_eq!(s, 201, "{rotated}");
    assert_eq!(rotated["previous"]["state"], "grace");
    assert_eq!(chat(k["key"].as_str().unwrap().into()).await.status, 200, "previous key works in grace");
    assert_eq!(chat(rotated["key"].as_str().unwrap().into()).await.status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    let r = chat(k["key"].as_str().unwrap().into()).await;
    assert_eq!(outcome(&r), (403, "auth_error".into(), "API key is deactivated".into()));
    assert_eq!(chat(rotated["key"].as_str().unwrap().into()).await.status, 200);
}

#[tokio::test]
async fn scoped_keys_follow_the_route_rules() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let dep = gw.mint_key(&gw.workspace, json!({"scope": "deployment"}));
    let term = gw.mint_key(&gw.workspace, json!({"scope": "terminal"}));
    let bearer = |k: &Value| format!("Bearer {}", k["key"].as_str().unwrap());
    let (d, t) = (bearer(&dep), bearer(&term));
    let r = call(&gw, "POST", "/v1/chat/completions", &[("authorization", &d)]).await;
    let o = outcome(&r);
    assert_eq!((o.0, o.1.as_str()), (400, "auth_error"));
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = call(&gw, "POST", "/v1/chat/completions", &[("authorization", &t)]).await;
    let o = outcome(&r);
    assert_eq!((o.0, o.1.as_str()), (403, "auth_error"));
    assert!(o.2.contains("internal"), "{}", o.2);
    for k in [&d, &t] {
        let r = call(&gw, "GET", "/v1/credits", &[("authorization", k)]).await;
        let v = r.assert_error(403, "credits_scope_violation");
        assert_eq!(v["error"]["type"], "permission_error");
        r.assert_error(403, "credits_scope_violation");
        call(&gw, "GET", "/v1/usage", &[("authorization", k)]).await.assert_error(403, "usage_scope_violation");
        // Model reads are fine with any live key.
        assert_eq!(call(&gw, "GET", "/v1/models", &[("authorization", k)]).await.status, 200);
    }
}

#[tokio::test]
async fn no_plaintext_key_in_logs_or_admin_reads() {
    let mock = Mock::start();
    // At the most verbose level too: Pingora's trace lines print whole request heads.
    // The replicas' own credential (sent upstream by the gateway) is never logged either.
    let replica_secret = "replica-secret-0123456789abcdef";
    let opts = Opts {
        env: vec![("RUST_LOG", "trace".into()), ("TEST_REPLICA_KEY", replica_secret.into())],
        chat_pool_extra: "    api_key_env: TEST_REPLICA_KEY\n".into(),
        ..Opts::default()
    };
    let gw = Gateway::start_with(&mock, opts);
    let k = gw.mint_key(&gw.workspace, json!({"name": "secret-check"}));
    let plain = k["key"].as_str().unwrap().to_string();
    let bearer = format!("Bearer {plain}");
    gw.post_as("/v1/chat/completions", &chat_body("chat-model", false), &[("authorization", &bearer)]).await;
    // A refused key of the right shape must not be logged either.
    let near = format!("Bearer {}x", &plain[..plain.len() - 1]);
    gw.post_as("/v1/chat/completions", &chat_body("chat-model", false), &[("authorization", &near)]).await;
    let (_, meta) = gw.admin("GET", &format!("/admin/v1/keys/{}", k["id"].as_str().unwrap()), None);
    assert_eq!(meta["state"], "active");
    assert_eq!(meta["copyable"], true);
    let meta_text = meta.to_string();
    assert!(!meta_text.contains(&plain[3..]), "admin read shows no key: {meta_text}");
    assert!(meta.get("digest").is_none() && meta.get("encrypted_copy").is_none());
    let log = gw.log();
    assert!(log.contains("DEBUG pingora"), "the log ran verbose");
    assert!(!log.contains(&plain[3..]), "gateway log shows no key");
    assert!(!log.contains(common::ADMIN_TOKEN), "gateway log shows no admin token");
    let sent = mock.last_request().await;
    assert_eq!(sent["headers"]["authorization"], format!("Bearer {replica_secret}"), "the replica got its credential");
    assert!(!log.contains(replica_secret), "gateway log shows no replica credential");
    assert!(!log.contains(&near[10..]), "gateway log shows no presented key");
    // The store's files are the owner's alone (decision 169).
    use std::os::unix::fs::PermissionsExt;
    for f in ["identity.db", "identity.db-wal"] {
        let mode = std::fs::metadata(gw.dir.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{f}: {mode:o}");
    }
    let db = std::fs::read(gw.dir.join("identity.db")).unwrap_or_default();
    let wal = std::fs::read(gw.dir.join("identity.db-wal")).unwrap_or_default();
    for bytes in [db, wal] {
        assert!(!bytes.windows(40).any(|w| w == &plain.as_bytes()[3..]), "no plaintext in the database files");
    }
}

#[test]
fn admin_listener_without_token_refuses_everything() {
    let mock = Mock::start();
    let gw = Gateway::start_with(&mock, Opts { no_admin_token: true, ..Opts::default() });
    for (m, p) in [("GET", "/admin/v1/health"), ("POST", "/admin/v1/workspaces"), ("GET", "/metrics")] {
        let (s, v) = gw.admin(m, p, Some(json!({"name": "x"})));
        assert_eq!(s, 401, "{m} {p}: {v}");
        assert_eq!(v["error"]["code"], "unauthorized");
        assert_eq!(v["error"]["message"], "missing or wrong admin token", "nothing said of the setup");
    }
}

#[test]
fn admin_token_and_field_validation() {
    let mock = Mock::start();
    let mut gw = Gateway::start(&mock);
    let (s, v) = gw.admin("GET", "/admin/v1/health", None);
    assert_eq!((s, v["status"].as_str()), (200, Some("ok")));
    let good = gw.admin_token.clone();
    gw.admin_token = "wrong-token-wrong-token".into();
    assert_eq!(gw.admin("GET", "/admin/v1/health", None).0, 401);
    gw.admin_token = good;
    // The scheme in any case; the token exactly.
    for (auth, status) in [
        (format!("BEARER {}", gw.admin_token), 200),
        (format!("bearer {}", gw.admin_token), 200),
        (format!("Basic {}", gw.admin_token), 401),
        (format!("Bearer {}", gw.admin_token.to_uppercase()), 401),
    ] {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", gw.admin_port)).unwrap();
        let head =
            format!("GET /admin/v1/health HTTP/1.1\r\nHost: a\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n");
        c.write_all(head.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = c.read_to_string(&mut answer);
        assert!(answer.starts_with(&format!("HTTP/1.1 {status} ")), "{auth}: {answer}");
    }
    let ws = gw.workspace.clone();
    let cases = [
        ("POST", "/admin/v1/workspaces".to_string(), json!({}), "name"),
        ("POST", "/admin/v1/workspaces".to_string(), json!({"name": "a", "rate_tier": "gold"}), "rate_tier"),
        ("POST", "/admin/v1/workspaces".to_string(), json!({"name": "a", "colour": 1}), "colour"),
        ("POST", format!("/admin/v1/workspaces/{ws}/keys"), json!({"scope": "root"}), "scope"),
        (
            "POST",
            format!("/admin/v1/workspaces/{ws}/keys"),
            json!({"monthly_spend_limit_cents": 99}),
            "monthly_spend_limit_cents",
        ),
        ("POST", format!("/admin/v1/workspaces/{ws}/keys"), json!({"expires_in_days": 7}), "expires_in_days"),
        ("POST", format!("/admin/v1/workspaces/{ws}/keys"), json!({"expires_at": "yesterday"}), "expires_at"),
        ("POST", format!("/admin/v1/workspaces/{ws}/keys"), json!({"rate_limit_rpm": -5}), "rate_limit_rpm"),
        ("POST", format!("/admin/v1/workspaces/{ws}/keys"), json!({"credits_only": "yes"}), "credits_only"),
    ];
    for (m, p, body, field) in cases {
        let (s, v) = gw.admin(m, &p, Some(body.clone()));
        assert_eq!(s, 400, "{body}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(&format!("`{field}`")), "{body}: {v}");
    }
    // Calls that take no fields refuse one too, and change nothing (decision 22).
    let (other_ws, _) = gw.mint_workspace_key(); // the key count below is of `ws`
    let k = gw.mint_key(&other_ws, json!({}));
    let kid = k["id"].as_str().unwrap();
    let no_fields = [
        ("POST", format!("/admin/v1/keys/{kid}/revoke")),
        ("DELETE", format!("/admin/v1/keys/{kid}")),
        ("POST", "/admin/v1/reload".to_string()),
        ("POST", "/admin/v1/models/chat-model/resume".to_string()),
        ("DELETE", format!("/admin/v1/workspaces/{ws}/plan")),
    ];
    for (m, p) in no_fields {
        let (s, v) = gw.admin(m, &p, Some(json!({"x": 1})));
        assert_eq!((s, v["error"]["code"].as_str()), (400, Some("invalid_field")), "{m} {p}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("`x`"), "{m} {p}: {v}");
    }
    let (s, meta) = gw.admin("GET", &format!("/admin/v1/keys/{kid}"), None);
    assert_eq!((s, meta["state"].as_str()), (200, Some("active")), "the refused revoke and delete changed nothing");
    // A known path with another method is 405 naming the methods (decision 175).
    for (m, p, allow) in [
        ("POST", "/admin/v1/health".to_string(), "GET"),
        ("GET", format!("/admin/v1/workspaces/{ws}/freeze"), "POST"),
        ("POST", format!("/admin/v1/keys/{kid}"), "GET, PATCH, DELETE"),
    ] {
        let url = format!("http://127.0.0.1:{}{p}", gw.admin_port);
        let r = std::thread::spawn({
            let token = gw.admin_token.clone();
            move || {
                use std::io::{Read, Write};
                let u = url.strip_prefix("http://").unwrap();
                let (host, path) = u.split_at(u.find('/').unwrap());
                let mut c = std::net::TcpStream::connect(host).unwrap();
                let head = format!("{m} {path} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {token}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                c.write_all(head.as_bytes()).unwrap();
                let mut answer = String::new();
                let _ = c.read_to_string(&mut answer);
                answer
            }
        })
        .join()
        .unwrap();
        assert!(r.starts_with("HTTP/1.1 405 "), "{m} {p}: {r}");
        assert!(r.to_ascii_lowercase().contains(&format!("allow: {}", allow.to_ascii_lowercase())), "{m} {p}: {r}");
        assert!(r.contains("method_not_allowed"), "{r}");
    }
    let (s, v) = gw.admin("POST", &format!("/admin/v1/workspaces/{ws}/keys"), Some(json!({"expires_in_days": 0})));
    assert_eq!(s, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("must be 30, 60, 90 or 365"), "{v}");
    // Each change leaves an audit line (method, path, status), never a body.
    assert!(gw.log().contains(&format!("admin: POST /admin/v1/keys/{kid}/revoke -> 400")), "{}", gw.log());
    assert_eq!(gw.admin("GET", "/admin/v1/keys/key_nope", None).0, 404);
    assert_eq!(gw.admin("GET", "/admin/v1/workspaces/nope", None).0, 404);
    assert_eq!(gw.admin("POST", "/admin/v1/workspaces/nope/keys", Some(json!({}))).0, 404);
    // At most ten live keys per scope on create: `api_key_limit` as a top-level code too.
    for _ in 0..9 {
        gw.mint_key(&ws, json!({}));
    }
    let (s, v) = gw.admin("POST", &format!("/admin/v1/workspaces/{ws}/keys"), Some(json!({})));
    assert_eq!((s, v["code"].as_str()), (400, Some("api_key_limit")), "{v}");
    // Copy: members may not; owners may, and the copy is the key.
    let k = gw.mint_key(&gw.mint_workspace_key().0, json!({"created_by": "ana"}));
    let id = k["id"].as_str().unwrap();
    let (s, _) = gw.admin("POST", &format!("/admin/v1/keys/{id}/copy"), Some(json!({"actor": "m", "role": "member"})));
    assert_eq!(s, 403);
    let (s, v) =
        gw.admin("POST", &format!("/admin/v1/keys/{id}/copy"), Some(json!({"actor": "ana", "role": "creator"})));
    assert_eq!((s, v["key"].as_str()), (200, k["key"].as_str()));
    gw.admin("POST", &format!("/admin/v1/keys/{id}/revoke"), None);
    let (s, _) = gw.admin("POST", &format!("/admin/v1/keys/{id}/copy"), Some(json!({"actor": "o", "role": "owner"})));
    assert_eq!(s, 409, "a revoked key cannot be copied");
}

#[tokio::test]
async fn revocation_reaches_a_second_instance_within_a_second() {
    let url = pg::fresh_database().await;
    let mock = Mock::start();
    let a = Gateway::start_with(&mock, Opts { postgres_url: Some(url.clone()), ..Opts::default() });
    let b = Gateway::start_with(&mock, Opts { postgres_url: Some(url), ..Opts::default() });
    let k = a.mint_key(&a.workspace, json!({}));
    let bearer = format!("Bearer {}", k["key"].as_str().unwrap());
    let body = chat_body("chat-model", false);
    let headers = [("authorization", bearer.as_str())];
    let on_b = || b.post_as("/v1/chat/completions", &body, &headers);
    assert_eq!(on_b().await.status, 200, "B knows the key (and caches it)");
    let (s, _) = a.admin("POST", &format!("/admin/v1/keys/{}/revoke", k["id"].as_str().unwrap()), None);
    assert_eq!(s, 200);
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let r = on_b().await;
    assert_eq!(outcome(&r), (403, "auth_error".into(), "API key is deactivated".into()));
}

/// `tollgate admin ...` against a running gateway: what an operator does from a shell,
/// workspaces, credits, freezing, the ledger and key updates included (decision 179).
#[test]
fn the_admin_command_line_covers_the_operator_surface() {
    let mock = Mock::start();
    let gw = Gateway::start(&mock);
    let admin = |args: &[&str]| -> (bool, Value) {
        let url = format!("http://127.0.0.1:{}", gw.admin_port);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["admin", "--url", &url, "--token", &gw.admin_token, "--json"])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.success(), serde_json::from_str(&text).unwrap_or(Value::String(text)))
    };
    let (ok, ws) = admin(&["workspace", "create", "--name", "shell"]);
    assert!(ok, "{ws}");
    let ws = ws["id"].as_str().unwrap().to_string();
    let (ok, v) = admin(&["credits", "add", &ws, "--cents", "500"]);
    assert!(ok && v["balance_cents"] == 600, "the $1 grant and the purchase: {v}");
    let (ok, v) = admin(&["credits", "add", &ws, "--cents", "5"]);
    assert!(!ok && v["error"]["code"] == "invalid_field", "a purchase under 500 cents is refused: {v}");
    let (ok, v) = admin(&["workspace", "freeze", &ws, "--reason", "dispute"]);
    assert!(ok && v["frozen"] == true, "{v}");
    let (ok, v) = admin(&["workspace", "unfreeze", &ws]);
    assert!(ok && v["frozen"] == false, "{v}");
    let (ok, v) = admin(&["workspace", "ledger", &ws]);
    assert!(ok && v["check"]["consistent"] == true, "{v}");
    assert_eq!(v["entries"].as_array().map(Vec::len), Some(2), "grant and purchase: {v}");
    let (ok, v) = admin(&["workspace", "show", &ws]);
    assert!(ok && v["rate_tier_in_force"] == "core", "{v}");
    let (ok, key) = admin(&["key", "create", &ws, "--rpm", "5"]);
    assert!(ok, "{key}");
    let id = key["id"].as_str().unwrap().to_string();
    let (ok, v) =
        admin(&["key", "update", &id, "--rpm", "none", "--monthly-limit-cents", "1000", "--credits-only", "true"]);
    assert!(ok, "{v}");
    assert_eq!(
        (v["rate_limit_rpm"].clone(), v["monthly_spend_limit_cents"].clone(), v["credits_only"].clone()),
        (Value::Null, json!(1000), json!(true)),
        "{v}"
    );
    let (ok, _) = admin(&["key", "update", &id]);
    assert!(!ok, "an update with nothing to change is refused");
    let (ok, v) = admin(&["key", "update", &id, "--expires-at", "2001-01-01T00:00:00Z"]);
    assert!(!ok && v["error"]["code"] == "invalid_field", "no expiry in the past (decision 167): {v}");
}
