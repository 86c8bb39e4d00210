//! The admin API's own rules: its token, field validation, and the `tollgate admin` command line.

use super::*;

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
