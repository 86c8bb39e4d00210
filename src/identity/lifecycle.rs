//! The key lifecycle of the spec as pure decisions over the keys of one scope: the caps
//! (10 live keys, 20 during a rotation), the rotation plan (previous key into grace, earlier
//! keys of the same history revoked) and revocation. Store backends read the rows under a
//! lock, ask these functions, then write what they say, so both behave identically.

use super::{KeyRecord, KeyState};
use crate::runtime::clock::Millis;

pub const MAX_LIVE_PER_SCOPE: usize = 10;
pub const MAX_LIVE_DURING_ROTATION: usize = 20;
/// Default rotation grace: 24 hours.
pub const DEFAULT_GRACE_MS: Millis = 24 * 3600 * 1000;

/// Why a key operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyOpError {
    NotFound,
    /// Creating would exceed 10 live keys in the scope (`api_key_limit`).
    LiveKeyLimit,
    /// Rotating would leave more than 20 live keys (`api_key_rotation_overlap_limit`).
    RotationOverlap,
    /// Only an active key can be rotated (or, besides one in grace, given a new expiry):
    /// its state, and what was asked.
    NotActive(KeyState, &'static str),
    /// The key has no encrypted copy (revoked, or created before copying existed).
    NotCopyable,
    /// The actor may not copy keys.
    CopyForbidden,
    Invalid {
        field: &'static str,
        message: String,
    },
    /// The store failed; nothing was changed.
    Store(String),
}

impl std::fmt::Display for KeyOpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyOpError::NotFound => write!(f, "no such key"),
            KeyOpError::LiveKeyLimit => {
                write!(f, "the scope already has {MAX_LIVE_PER_SCOPE} live keys")
            }
            KeyOpError::RotationOverlap => {
                write!(f, "rotating would leave more than {MAX_LIVE_DURING_ROTATION} live keys in the scope")
            }
            KeyOpError::NotActive(s, asked) => {
                let state = if *s == KeyState::Grace { "in its rotation grace" } else { s.as_str() };
                write!(f, "only an active key can be {asked}; this key is {state}")
            }
            KeyOpError::NotCopyable => {
                write!(
                    f,
                    "this key has no copy to give (a revoked or expired key never has one; an active key minted before copies existed gets one by rotating it)"
                )
            }
            KeyOpError::CopyForbidden => {
                write!(f, "only the key's creator or a workspace owner may copy it")
            }
            KeyOpError::Invalid { field, message } => write!(f, "{field}: {message}"),
            KeyOpError::Store(m) => write!(f, "store unavailable: {m}"),
        }
    }
}

/// Live keys among `keys` at `now`.
pub fn live_count(keys: &[KeyRecord], now: Millis) -> usize {
    keys.iter().filter(|k| k.is_live(now)).count()
}

/// May one more key be created in a scope holding `scope_keys`?
pub fn check_create(scope_keys: &[KeyRecord], now: Millis) -> Result<(), KeyOpError> {
    if live_count(scope_keys, now) >= MAX_LIVE_PER_SCOPE {
        return Err(KeyOpError::LiveKeyLimit);
    }
    Ok(())
}

/// What a rotation changes besides inserting the new key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationPlan {
    /// New `grace_until` of the previous key; `None` when it is revoked at once.
    pub previous_grace_until: Option<Millis>,
    pub revoke_previous: bool,
    /// Earlier live keys of the same rotation history, revoked now.
    pub revoke: Vec<String>,
}

/// Plan rotating `target` (one of `scope_keys`) at `now`.
/// `grace_ms`: the grace asked for (default 24 h, at most 24 h); the previous key's own
/// expiry ends it sooner.
pub fn plan_rotation(
    target: &KeyRecord,
    scope_keys: &[KeyRecord],
    now: Millis,
    revoke_previous_immediately: bool,
    grace_ms: Option<Millis>,
) -> Result<RotationPlan, KeyOpError> {
    let state = target.state(now);
    if state != KeyState::Active {
        return Err(KeyOpError::NotActive(state, "rotated"));
    }
    let grace = grace_ms.unwrap_or(DEFAULT_GRACE_MS);
    if !(0..=DEFAULT_GRACE_MS).contains(&grace) {
        return Err(KeyOpError::Invalid { field: "grace_seconds", message: "must be between 0 and 86400".into() });
    }
    let revoke: Vec<String> = scope_keys
        .iter()
        .filter(|k| k.id != target.id && k.rotation_root == target.rotation_root && k.is_live(now))
        .map(|k| k.id.clone())
        .collect();
    let revoke_previous = revoke_previous_immediately || grace == 0;
    // Live after: everything live now, minus what is revoked, plus the new key.
    let live_after = live_count(scope_keys, now) - revoke.len() - usize::from(revoke_previous) + 1;
    if live_after > MAX_LIVE_DURING_ROTATION {
        return Err(KeyOpError::RotationOverlap);
    }
    let previous_grace_until = (!revoke_previous).then(|| {
        let until = now + grace;
        target.expires_at.map_or(until, |e| e.min(until))
    });
    Ok(RotationPlan { previous_grace_until, revoke_previous, revoke })
}

/// A key's expiry may change (`PATCH`) only while it works, and only to a time ahead: an
/// expired, revoked or grace-ended key never comes back (the spec's lifecycle has no way out
/// of those states), and a past expiry is refused as on create. `new_expiry`: `None` when
/// the patch leaves it alone, `Some(None)` when it clears it.
pub fn check_expiry_change(
    target: &KeyRecord,
    new_expiry: Option<Option<Millis>>,
    now: Millis,
) -> Result<(), KeyOpError> {
    let Some(new_expiry) = new_expiry else { return Ok(()) };
    let state = target.state(now);
    if !matches!(state, KeyState::Active | KeyState::Grace) {
        return Err(KeyOpError::NotActive(state, "given a new expiry"));
    }
    if new_expiry.is_some_and(|e| e <= now) {
        return Err(KeyOpError::Invalid { field: "expires_at", message: "must be in the future".into() });
    }
    Ok(())
}

/// The new key of a rotation inherits the previous key's scope, name, flags and limits
/// (the credits-only flag survives rotation); it starts its own life without expiry unless
/// the previous key had one, which it keeps.
pub fn successor(previous: &KeyRecord, id: String, digest: String, encrypted_copy: Vec<u8>, now: Millis) -> KeyRecord {
    KeyRecord {
        id,
        workspace_id: previous.workspace_id.clone(),
        name: previous.name.clone(),
        scope: previous.scope,
        digest,
        format_version: super::keys::CURRENT_FORMAT,
        encrypted_copy: Some(encrypted_copy),
        created_by: previous.created_by.clone(),
        created_at: now,
        expires_at: previous.expires_at.filter(|&e| e > now),
        revoked_at: None,
        grace_until: None,
        rotated_from: Some(previous.id.clone()),
        rotation_root: previous.rotation_root.clone(),
        credits_only: previous.credits_only,
        monthly_spend_limit_cents: previous.monthly_spend_limit_cents,
        rate_limit_rpm: previous.rate_limit_rpm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::KeyScope;

    fn key(id: &str, root: &str) -> KeyRecord {
        KeyRecord {
            id: id.into(),
            workspace_id: "ws".into(),
            name: None,
            scope: KeyScope::Workspace,
            digest: format!("v1:{id}"),
            format_version: 1,
            encrypted_copy: Some(vec![1]),
            created_by: None,
            created_at: 0,
            expires_at: None,
            revoked_at: None,
            grace_until: None,
            rotated_from: None,
            rotation_root: root.into(),
            credits_only: false,
            monthly_spend_limit_cents: None,
            rate_limit_rpm: None,
        }
    }

    #[test]
    fn create_stops_at_ten_live_keys() {
        let mut keys: Vec<KeyRecord> = (0..9).map(|i| key(&format!("k{i}"), &format!("k{i}"))).collect();
        assert!(check_create(&keys, 1).is_ok());
        keys.push(key("k9", "k9"));
        assert_eq!(check_create(&keys, 1), Err(KeyOpError::LiveKeyLimit));
        keys[0].revoked_at = Some(0);
        assert!(check_create(&keys, 1).is_ok(), "revoked keys do not count");
    }

    #[test]
    fn rotation_puts_previous_in_grace_and_revokes_earlier_history() {
        let mut k1 = key("k1", "k1");
        k1.grace_until = Some(10_000);
        let mut k2 = key("k2", "k1");
        k2.rotated_from = Some("k1".into());
        let other = key("o", "o");
        let plan = plan_rotation(&k2, &[k1, k2.clone(), other], 100, false, None).unwrap();
        assert_eq!(plan.previous_grace_until, Some(100 + DEFAULT_GRACE_MS));
        assert_eq!(plan.revoke, vec!["k1".to_string()], "other histories untouched");
        assert!(!plan.revoke_previous);
    }

    #[test]
    fn grace_ends_at_the_previous_keys_expiry_if_sooner() {
        let mut k = key("k", "k");
        k.expires_at = Some(5_000);
        let plan = plan_rotation(&k, std::slice::from_ref(&k), 1_000, false, None).unwrap();
        assert_eq!(plan.previous_grace_until, Some(5_000));
    }

    #[test]
    fn rotation_refused_above_twenty_live_keys_and_for_inactive_keys() {
        let mut keys: Vec<KeyRecord> = (0..20).map(|i| key(&format!("k{i}"), &format!("k{i}"))).collect();
        let target = keys[0].clone();
        assert_eq!(plan_rotation(&target, &keys, 1, false, None), Err(KeyOpError::RotationOverlap));
        // Revoking the previous key at once keeps the count at twenty.
        assert!(plan_rotation(&target, &keys, 1, true, None).is_ok());
        keys.truncate(19);
        assert!(plan_rotation(&target, &keys, 1, false, None).is_ok());
        let mut revoked = key("r", "r");
        revoked.revoked_at = Some(0);
        assert_eq!(
            plan_rotation(&revoked, &[], 1, false, None),
            Err(KeyOpError::NotActive(KeyState::Revoked, "rotated"))
        );
    }

    #[test]
    fn an_expired_or_revoked_key_gets_no_new_expiry_and_none_is_set_in_the_past() {
        let mut k = key("k", "k");
        assert!(check_expiry_change(&k, None, 100).is_ok(), "a patch without expiry");
        assert!(check_expiry_change(&k, Some(Some(101)), 100).is_ok());
        assert!(check_expiry_change(&k, Some(None), 100).is_ok(), "cleared while active");
        let past = check_expiry_change(&k, Some(Some(100)), 100);
        assert!(matches!(past, Err(KeyOpError::Invalid { field: "expires_at", .. })), "{past:?}");
        k.expires_at = Some(50);
        for revive in [Some(Some(1_000)), Some(None)] {
            assert_eq!(
                check_expiry_change(&k, revive, 100),
                Err(KeyOpError::NotActive(KeyState::Expired, "given a new expiry"))
            );
        }
        k.expires_at = None;
        k.grace_until = Some(200);
        assert!(check_expiry_change(&k, Some(Some(150)), 100).is_ok(), "in grace it still works");
        assert_eq!(
            check_expiry_change(&k, Some(None), 300),
            Err(KeyOpError::NotActive(KeyState::Revoked, "given a new expiry"))
        );
        k.grace_until = None;
        k.revoked_at = Some(1);
        assert_eq!(
            check_expiry_change(&k, Some(Some(1_000)), 100),
            Err(KeyOpError::NotActive(KeyState::Revoked, "given a new expiry"))
        );
    }

    #[test]
    fn states_follow_the_lifecycle_table() {
        let mut k = key("k", "k");
        assert_eq!(k.state(0), KeyState::Active);
        k.grace_until = Some(100);
        assert_eq!(k.state(99), KeyState::Grace);
        assert_eq!(k.state(100), KeyState::Revoked, "grace ended answers like revoked (C8)");
        k.expires_at = Some(50);
        assert_eq!(k.state(50), KeyState::Expired, "expiry at the instant it passes");
        k.revoked_at = Some(1);
        assert_eq!(k.state(0), KeyState::Revoked);
    }

    #[test]
    fn successor_keeps_flags_and_limits() {
        let mut k = key("k", "root");
        k.credits_only = true;
        k.monthly_spend_limit_cents = Some(500);
        let s = successor(&k, "n".into(), "v1:n".into(), vec![2], 10);
        assert!(s.credits_only);
        assert_eq!(s.monthly_spend_limit_cents, Some(500));
        assert_eq!(s.rotation_root, "root");
        assert_eq!(s.rotated_from.as_deref(), Some("k"));
    }
}
