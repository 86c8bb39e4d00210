use super::*;
use serde_json::json;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, v.parse().unwrap_or_else(|_| http::HeaderValue::from_static("")));
    }
    h
}

fn named(pairs: &[(&'static str, &str)], body: Value) -> Option<(&'static str, String)> {
    resolve(&headers(pairs), Some(&body))
}

#[test]
fn sources_are_taken_in_the_spec_order() {
    let all = [
        ("x-service-session", "svc"),
        ("x-session-id", "sid"),
        ("x-agent1-session-id", "a1"),
        ("x-agent2-session-id", "a2"),
        ("x-session-affinity", "aff"),
        ("x-affinity", "xa"),
        ("thread-id", "th"),
        ("session-id", "se"),
        ("x-agent3-window-id", "w"),
        ("x-parent-session-id", "parent"),
    ];
    let body = json!({"service": {"sessionId": "body-1"}, "prompt_cache_key": "pck"});
    assert_eq!(named(&all, body.clone()), Some(("service", "body-1".into())));
    let expected = [
        ("service", "svc"),
        ("generic", "sid"),
        ("agent1", "a1"),
        ("agent2", "a2"),
        ("generic", "aff"),
        ("generic", "xa"),
        ("generic", "th"),
        ("generic", "se"),
        ("generic", "parent"),
        ("prompt_cache_key", "pck"),
    ];
    // Remove the winner each time: the next source in order names the session.
    let sources: Vec<(&'static str, &str)> = all.iter().copied().filter(|(k, _)| *k != "x-agent3-window-id").collect();
    for (n, want) in expected.iter().enumerate() {
        let mut hs: Vec<(&'static str, &str)> = sources.iter().copied().skip(n).collect();
        hs.push(("x-agent3-window-id", "w")); // thread-id and session-id need it
        let got = named(&hs, json!({"prompt_cache_key": "pck"}));
        assert_eq!(got, Some((want.0, want.1.to_string())), "after removing {n} sources");
    }
}

#[test]
fn invalid_candidates_are_skipped_and_never_mask_a_valid_one_below() {
    // Bad shapes for the service namespace, an empty (after trimming) header, a control char.
    let body = json!({"service": {"sessionId": "has space"}});
    let too_long = "x".repeat(129);
    let h = [("x-service-session", too_long.as_str()), ("x-session-id", "   "), ("x-agent2-session-id", "ok")];
    assert_eq!(named(&h, body), Some(("agent2", "ok".into())));
    assert_eq!(named(&[("x-session-id", " padded ")], json!({})), Some(("generic", "padded".into())), "trimmed");
    // Too long once resolved: skipped.
    let long = "l".repeat(300);
    assert_eq!(
        named(&[("x-session-id", long.as_str()), ("x-affinity", "b")], json!({})),
        Some(("generic", "b".into()))
    );
    // The bound is 256 characters; an agent's namespace counts toward it, others do not.
    let at_bound = "a".repeat(256);
    assert_eq!(named(&[("x-session-id", at_bound.as_str())], json!({})), Some(("generic", at_bound.clone())));
    let agent = [("x-agent2-session-id", at_bound.as_str()), ("x-affinity", "b")];
    assert_eq!(named(&agent, json!({})), Some(("generic", "b".into())), "agent2: + 256 is over");
    let fits = "a".repeat(256 - "agent2:".len());
    assert_eq!(named(&[("x-agent2-session-id", fits.as_str())], json!({})), Some(("agent2", fits.clone())));
    // thread-id and session-id only with a nonempty x-agent3-window-id.
    assert_eq!(named(&[("thread-id", "t")], json!({})), None);
    assert_eq!(named(&[("thread-id", "t"), ("x-agent3-window-id", " ")], json!({})), None);
}

#[test]
fn agent_ids_namespaces_and_the_parent_session() {
    assert_eq!(
        named(&[("x-agent1-session-id", "s"), ("x-agent1-agent-id", "sub")], json!({})),
        Some(("agent1", "s/sub".into())),
        "a valid agent id adds a subagent identity"
    );
    // The parent only when the request names no session of its own.
    assert_eq!(
        named(&[("x-parent-session-id", "p"), ("x-affinity", "own")], json!({})),
        Some(("generic", "own".into()))
    );
    assert_eq!(named(&[("x-parent-session-id", "p")], json!({"prompt_cache_key": "k"})), Some(("generic", "p".into())));
    // The same value in two namespaces is two sessions; a parent lands on its generic session.
    assert_ne!(key("w", "agent1", "s"), key("w", "generic", "s"));
    assert_eq!(key("w", "generic", "p"), key("w", "generic", "p"));
    assert_ne!(key("w1", "generic", "p"), key("w2", "generic", "p"), "scoped to the workspace");
    assert_ne!(key("w", "generic", "ab"), key("w", "generica", "b"), "parts are length-framed");
    // `user` is not an identity.
    assert_eq!(named(&[], json!({"user": "alice"})), None);
}

#[test]
fn the_affinity_key_is_the_same_in_every_instance_and_version() {
    // Placements are shared between instances on Redis: the key must not depend on the
    // process (no random seed) nor change silently between releases.
    assert_eq!(key("ws_1", "generic", "session-42"), PINNED_KEY);
}

#[test]
fn the_opening_messages_name_a_conversation_on_every_turn() {
    let turn1 = json!({"user": "u", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]});
    let turn2 = json!({"user": "u", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]});
    let other = json!({"user": "u", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "bye"}]});
    let a = |b: &Value| affinity("w", &HeaderMap::new(), Some(b));
    assert_eq!(a(&turn1), a(&turn2));
    assert_eq!(a(&turn1).map(|x| x.by), Some(PlacedBy::Opening));
    assert_ne!(a(&turn1), a(&other));
    assert_eq!(a(&json!({"messages": []})), None, "nothing to place by");
    let with_session = affinity("w", &headers(&[("x-session-id", "s")]), Some(&turn1));
    assert_eq!(with_session.map(|x| x.by), Some(PlacedBy::Session));
}

/// `key("ws_1", "generic", "session-42")`: SipHash-1-3 under the keys "tollgate", "affinity"
/// (little-endian), over each part's length (8 bytes, little-endian) and bytes, computed by a
/// separate Python implementation checked against the SipHash reference vector (decision
/// 135). A change here moves every session's placement once.
const PINNED_KEY: u64 = 5_417_913_908_057_210_293;
