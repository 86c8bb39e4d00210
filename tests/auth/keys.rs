//! Keys through the gateway on every route class: refusals, lifecycle, scopes, secrecy, revocation.

use super::*;

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
