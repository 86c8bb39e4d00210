//! The identity store suite, run against both backends (SQLite file, PostgreSQL), plus the
//! identity service over each: caps, rotation, revocation, deletion, copy audit, and that no
//! plaintext key is ever stored.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::pg;
use tollgate::identity::keys::KeySecrets;
use tollgate::identity::lifecycle::KeyOpError;
use tollgate::identity::service::cache::KeyCache;
use tollgate::identity::service::{CopyRole, Identity, NewKey};
use tollgate::identity::{KeyScope, KeyState, RateTier};
use tollgate::runtime::clock::now_ms;
use tollgate::store::{IdentityStore, KeyPatch, RotateOpts, StoreConfig};

async fn sqlite() -> Arc<dyn IdentityStore> {
    let dir =
        std::env::temp_dir().join(format!("tollgate-store-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()));
    let store = tollgate::store::open(&StoreConfig::Sqlite { path: dir.join("t.db") }).await.unwrap();
    store.migrate().await.unwrap();
    store
}

async fn postgres() -> Arc<dyn IdentityStore> {
    let url = pg::fresh_database().await;
    let store = tollgate::store::open(&StoreConfig::postgres(url)).await.unwrap();
    store.migrate().await.unwrap();
    store
}

fn identity(store: Arc<dyn IdentityStore>) -> Identity {
    let secrets = KeySecrets::new(&[9u8; 32], &"cd".repeat(32)).unwrap();
    Identity::new(store, secrets, KeyCache::default())
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::sqlite().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::postgres().await).await
            }
        }
    )*};
}

both_backends!(
    keys_round_trip_by_digest,
    at_most_ten_live_keys_per_scope_even_when_racing,
    rotation_grace_history_and_other_keys,
    rotation_over_twenty_live_keys_changes_nothing,
    revoke_erases_the_copy_and_delete_forgets,
    patch_copy_rules_and_audit,
    migrations_are_idempotent,
    no_plaintext_key_is_stored,
    copies_of_keys_past_their_grace_or_expiry_are_erased,
    a_key_of_an_older_format_is_flagged_until_rotated,
);

async fn keys_round_trip_by_digest(store: Arc<dyn IdentityStore>) {
    let id = identity(store.clone());
    let ws = id.create_workspace("acme", RateTier::Core).await.unwrap();
    let (rec, key) = id.create_key(&ws.id, NewKey { name: Some("ci".into()), ..NewKey::default() }).await.unwrap();
    let (found, found_ws) = id.authenticate(&key).await.unwrap();
    assert_eq!(found.id, rec.id);
    assert_eq!(found_ws.rate_tier, RateTier::Core);
    assert_eq!(store.key(&rec.id).await.unwrap().unwrap().name.as_deref(), Some("ci"));
    assert!(store.key_by_digest("v1:nothing").await.unwrap().is_none());
    assert!(id.create_key("no-such-workspace", NewKey::default()).await.is_err());
}

async fn at_most_ten_live_keys_per_scope_even_when_racing(store: Arc<dyn IdentityStore>) {
    let id = Arc::new(identity(store));
    let ws = id.create_workspace("race", RateTier::Free).await.unwrap();
    let tasks: Vec<_> = (0..25)
        .map(|_| {
            let id = id.clone();
            let ws = ws.id.clone();
            tokio::spawn(async move { id.create_key(&ws, NewKey::default()).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!(e, KeyOpError::LiveKeyLimit),
        }
    }
    assert_eq!(ok, 10, "exactly ten live keys per scope");
    // Another scope has its own ten.
    let other = id.create_key(&ws.id, NewKey { scope: Some(KeyScope::Deployment), ..NewKey::default() }).await;
    assert!(other.is_ok());
}

async fn rotation_grace_history_and_other_keys(store: Arc<dyn IdentityStore>) {
    let id = identity(store.clone());
    let ws = id.create_workspace("rot", RateTier::Free).await.unwrap();
    let (k1, p1) = id.create_key(&ws.id, NewKey { credits_only: true, ..NewKey::default() }).await.unwrap();
    let (other, p_other) = id.create_key(&ws.id, NewKey::default()).await.unwrap();
    let (k2, p2, prev) = id.rotate_key(&k1.id, RotateOpts::default()).await.unwrap();
    assert_eq!(prev.state(now_ms()), KeyState::Grace);
    let grace = prev.grace_until.unwrap() - now_ms();
    assert!((86_300_000..=86_400_000).contains(&grace), "24 h grace by default: {grace}");
    assert!(k2.credits_only, "the credits-only flag survives rotation");
    assert!(id.authenticate(&p1).await.is_ok(), "previous key works during grace");
    // Rotating again revokes k1 (earlier in the history); k2 goes into grace.
    let (_k3, p3, prev2) = id.rotate_key(&k2.id, RotateOpts::default()).await.unwrap();
    assert_eq!(prev2.id, k2.id);
    assert_eq!(store.key(&k1.id).await.unwrap().unwrap().state(now_ms()), KeyState::Revoked);
    assert!(store.key(&k1.id).await.unwrap().unwrap().encrypted_copy.is_none());
    assert!(id.authenticate(&p2).await.is_ok());
    assert!(id.authenticate(&p3).await.is_ok());
    assert!(id.authenticate(&p_other).await.is_ok(), "other keys stay live");
    assert_eq!(store.key(&other.id).await.unwrap().unwrap().state(now_ms()), KeyState::Active);
    // Only an active key can be rotated.
    assert!(matches!(id.rotate_key(&k1.id, RotateOpts::default()).await, Err(KeyOpError::NotActive(..))));
    // Revoke-previous-immediately.
    let (k4, _p4) = id.create_key(&ws.id, NewKey::default()).await.unwrap();
    let (_k5, _p5, prev4) =
        id.rotate_key(&k4.id, RotateOpts { revoke_previous_immediately: true, grace_ms: None }).await.unwrap();
    assert_eq!(prev4.state(now_ms()), KeyState::Revoked);
    // A short grace ends on time.
    let (k6, p6) = id.create_key(&ws.id, NewKey::default()).await.unwrap();
    id.rotate_key(&k6.id, RotateOpts { revoke_previous_immediately: false, grace_ms: Some(300) }).await.unwrap();
    assert!(id.authenticate(&p6).await.is_ok());
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    assert_eq!(id.authenticate(&p6).await.err(), Some(tollgate::identity::service::AuthFailure::Deactivated));
}

fn raw_key(ws: &str, expires_at: Option<i64>) -> tollgate::identity::KeyRecord {
    let id = format!("key_{}", uuid::Uuid::new_v4().simple());
    tollgate::identity::KeyRecord {
        id: id.clone(),
        workspace_id: ws.to_string(),
        name: None,
        scope: KeyScope::Workspace,
        digest: format!("v1:{id}"),
        format_version: 1,
        encrypted_copy: None,
        created_by: None,
        created_at: now_ms(),
        expires_at,
        revoked_at: None,
        grace_until: None,
        rotated_from: None,
        rotation_root: id,
        credits_only: false,
        monthly_spend_limit_cents: None,
        rate_limit_rpm: None,
    }
}

async fn rotation_over_twenty_live_keys_changes_nothing(store: Arc<dyn IdentityStore>) {
    // Through the API each history holds at most two live keys and a scope at most ten
    // histories, so twenty is the ceiling; rows written at other instants reach past it,
    // and the rotation guard must still refuse and change nothing.
    let id = identity(store.clone());
    let ws = id.create_workspace("overlap", RateTier::Free).await.unwrap();
    let now = now_ms();
    for _ in 0..10 {
        store.create_key(&raw_key(&ws.id, Some(now + 60_000)), now).await.unwrap();
    }
    let mut later = Vec::new();
    for _ in 0..10 {
        // Written "after" the first ten expired, so the creation cap lets them in.
        let k = raw_key(&ws.id, None);
        store.create_key(&k, now + 120_000).await.unwrap();
        later.push(k);
    }
    let target = &later[0];
    let refused = id.rotate_key(&target.id, RotateOpts::default()).await;
    assert_eq!(refused.err(), Some(KeyOpError::RotationOverlap));
    let after = store.key(&target.id).await.unwrap().unwrap();
    assert_eq!(after, *target, "nothing changed");
    // Revoking the previous key at once keeps the scope at twenty: allowed.
    let ok = id.rotate_key(&target.id, RotateOpts { revoke_previous_immediately: true, grace_ms: None }).await;
    assert!(ok.is_ok());
}

async fn a_key_of_an_older_format_is_flagged_until_rotated(store: Arc<dyn IdentityStore>) {
    // Spec, API key: "a key older than the current format is flagged and must be rotated to
    // get the current format".
    let id = identity(store.clone());
    let ws = id.create_workspace("legacy", RateTier::Free).await.unwrap();
    let current = tollgate::identity::keys::CURRENT_FORMAT;
    let old = tollgate::identity::KeyRecord { format_version: current - 1, ..raw_key(&ws.id, None) };
    store.create_key(&old, now_ms()).await.unwrap();
    let stored = store.key(&old.id).await.unwrap().unwrap();
    assert_eq!(stored.format_version, current - 1, "the format is stored as written");
    assert!(stored.legacy_format(), "an older format is flagged");
    let (fresh, _) = id.create_key(&ws.id, NewKey::default()).await.unwrap();
    assert!(!fresh.legacy_format(), "a new key has the current format");
    let (successor, _, previous) = id.rotate_key(&old.id, RotateOpts::default()).await.unwrap();
    assert!(previous.legacy_format(), "the rotated key keeps its flag through its grace");
    let stored = store.key(&successor.id).await.unwrap().unwrap();
    assert_eq!(stored.format_version, current);
    assert!(!stored.legacy_format(), "rotation gives the current format");
}

async fn revoke_erases_the_copy_and_delete_forgets(store: Arc<dyn IdentityStore>) {
    let id = identity(store.clone());
    let ws = id.create_workspace("rev", RateTier::Free).await.unwrap();
    let (k, p) = id.create_key(&ws.id, NewKey::default()).await.unwrap();
    assert!(store.key(&k.id).await.unwrap().unwrap().encrypted_copy.is_some());
    id.revoke_key(&k.id).await.unwrap();
    let stored = store.key(&k.id).await.unwrap().unwrap();
    assert!(stored.encrypted_copy.is_none(), "the encrypted copy is erased on revocation");
    assert_eq!(id.authenticate(&p).await.err(), Some(tollgate::identity::service::AuthFailure::Deactivated));
    let (k2, p2) = id.create_key(&ws.id, NewKey::default()).await.unwrap();
    assert!(id.delete_key(&k2.id).await.unwrap());
    assert_eq!(id.authenticate(&p2).await.err(), Some(tollgate::identity::service::AuthFailure::Invalid));
    assert!(!id.delete_key(&k2.id).await.unwrap());
    // Expiry: 401 expired at the instant it passes.
    let (k3, p3) =
        id.create_key(&ws.id, NewKey { expires_at: Some(now_ms() + 400), ..NewKey::default() }).await.unwrap();
    assert!(id.authenticate(&p3).await.is_ok());
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(id.authenticate(&p3).await.err(), Some(tollgate::identity::service::AuthFailure::Expired));
    let _ = k3;
}

async fn patch_copy_rules_and_audit(store: Arc<dyn IdentityStore>) {
    let id = identity(store.clone());
    let ws = id.create_workspace("copy", RateTier::Free).await.unwrap();
    let (k, p) = id.create_key(&ws.id, NewKey { created_by: Some("ana".into()), ..NewKey::default() }).await.unwrap();
    let patched = id
        .update_key(
            &k.id,
            &KeyPatch {
                monthly_spend_limit_cents: Some(Some(500)),
                rate_limit_rpm: Some(Some(60)),
                ..KeyPatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(patched.monthly_spend_limit_cents, Some(500));
    assert_eq!(patched.rate_limit_rpm, Some(60));
    assert_eq!(id.copy_key(&k.id, "ana", CopyRole::Creator).await.unwrap(), p);
    assert_eq!(id.copy_key(&k.id, "boss", CopyRole::Owner).await.unwrap(), p);
    assert_eq!(id.copy_key(&k.id, "bob", CopyRole::Creator).await.err(), Some(KeyOpError::CopyForbidden));
    assert_eq!(id.copy_key(&k.id, "m", CopyRole::Member).await.err(), Some(KeyOpError::CopyForbidden));
    assert_eq!(id.copy_key(&k.id, "v", CopyRole::Viewer).await.err(), Some(KeyOpError::CopyForbidden));
    let audit = store.copy_audit(&k.id).await.unwrap();
    let who: Vec<(&str, &str)> = audit.iter().map(|a| (a.actor.as_str(), a.role.as_str())).collect();
    assert_eq!(who, vec![("ana", "creator"), ("boss", "owner")], "each copy audited, refusals not");
    // A key from before copying existed cannot be copied; rotating gives a copyable one.
    let (old, _) = id.create_key(&ws.id, NewKey { without_copy: true, ..NewKey::default() }).await.unwrap();
    assert_eq!(id.copy_key(&old.id, "boss", CopyRole::Owner).await.err(), Some(KeyOpError::NotCopyable));
    let (new, new_plain, _) = id.rotate_key(&old.id, RotateOpts::default()).await.unwrap();
    assert_eq!(id.copy_key(&new.id, "boss", CopyRole::Owner).await.unwrap(), new_plain);
}

async fn migrations_are_idempotent(store: Arc<dyn IdentityStore>) {
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    store.ping().await.unwrap();
}

async fn no_plaintext_key_is_stored(store: Arc<dyn IdentityStore>) {
    let id = identity(store.clone());
    let ws = id.create_workspace("secret", RateTier::Free).await.unwrap();
    let mut plains = Vec::new();
    for _ in 0..3 {
        plains.push(id.create_key(&ws.id, NewKey::default()).await.unwrap());
    }
    let (rotated, rotated_plain, _) = id.rotate_key(&plains[0].0.id, RotateOpts::default()).await.unwrap();
    let _ = rotated;
    for (rec, plain) in
        plains.iter().map(|(r, p)| (r, p.as_str())).chain(std::iter::once((&plains[0].0, rotated_plain.as_str())))
    {
        let stored = store.key(&rec.id).await.unwrap().unwrap();
        let row = format!("{stored:?}");
        assert!(!row.contains(plain), "plaintext in the stored row");
        assert!(!row.contains(&plain[3..]), "key body in the stored row");
        assert!(stored.digest.starts_with("v1:"));
    }
}

async fn copies_of_keys_past_their_grace_or_expiry_are_erased(store: Arc<dyn IdentityStore>) {
    let id = identity(store.clone());
    let ws = id.create_workspace("erase", RateTier::Free).await.unwrap();
    let (rotated, _) = id.create_key(&ws.id, NewKey::default()).await.unwrap();
    id.rotate_key(&rotated.id, RotateOpts { revoke_previous_immediately: false, grace_ms: Some(200) }).await.unwrap();
    let expiring = NewKey { expires_at: Some(now_ms() + 200), ..NewKey::default() };
    let (expired, _) = id.create_key(&ws.id, expiring).await.unwrap();
    let (live, _) = id.create_key(&ws.id, NewKey::default()).await.unwrap();
    assert_eq!(store.erase_dead_copies(now_ms()).await.unwrap(), 0, "all still working");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(store.erase_dead_copies(now_ms()).await.unwrap(), 2);
    for dead in [&rotated.id, &expired.id] {
        let k = store.key(dead).await.unwrap().unwrap();
        assert!(k.encrypted_copy.is_none(), "{dead}: its copy is gone");
        assert!(matches!(id.copy_key(dead, "owner", CopyRole::Owner).await, Err(KeyOpError::NotCopyable)));
    }
    assert!(store.key(&live.id).await.unwrap().unwrap().encrypted_copy.is_some(), "a working key keeps its copy");
    assert_eq!(store.erase_dead_copies(now_ms()).await.unwrap(), 0, "once");
}
