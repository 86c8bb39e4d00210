//! The identity tables' rows in SQLite: keys and workspaces read from and written to rows.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::identity::{KeyRecord, KeyScope, RateTier, Workspace};

pub(in crate::store) const KEY_COLUMNS: &str = "id, workspace_id, name, scope, digest, format_version, encrypted_copy, created_by, \
     created_at, expires_at, revoked_at, grace_until, rotated_from, rotation_root, credits_only, \
     monthly_spend_limit_cents, rate_limit_rpm";

pub(in crate::store) fn key_from_row(r: &Row<'_>) -> rusqlite::Result<KeyRecord> {
    let scope: String = r.get(3)?;
    Ok(KeyRecord {
        id: r.get(0)?,
        workspace_id: r.get(1)?,
        name: r.get(2)?,
        scope: KeyScope::parse(&scope).unwrap_or(KeyScope::Workspace),
        digest: r.get(4)?,
        format_version: r.get(5)?,
        encrypted_copy: r.get(6)?,
        created_by: r.get(7)?,
        created_at: r.get(8)?,
        expires_at: r.get(9)?,
        revoked_at: r.get(10)?,
        grace_until: r.get(11)?,
        rotated_from: r.get(12)?,
        rotation_root: r.get(13)?,
        credits_only: r.get(14)?,
        monthly_spend_limit_cents: r.get(15)?,
        rate_limit_rpm: r.get(16)?,
    })
}

pub(in crate::store) fn ws_from_row(r: &Row<'_>, at: usize) -> rusqlite::Result<Workspace> {
    let tier: String = r.get(at + 2)?;
    Ok(Workspace {
        id: r.get(at)?,
        name: r.get(at + 1)?,
        rate_tier: RateTier::parse(&tier).unwrap_or(RateTier::Free),
        created_at: r.get(at + 3)?,
        frozen: r.get(at + 4)?,
        lifetime_purchases_cents: r.get(at + 5)?,
        plan: None,
    })
}

pub(in crate::store) fn insert_key(c: &Connection, k: &KeyRecord) -> rusqlite::Result<usize> {
    c.execute(
        &format!(
            "INSERT INTO api_keys ({KEY_COLUMNS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17)"
        ),
        params![
            k.id,
            k.workspace_id,
            k.name,
            k.scope.as_str(),
            k.digest,
            k.format_version,
            k.encrypted_copy,
            k.created_by,
            k.created_at,
            k.expires_at,
            k.revoked_at,
            k.grace_until,
            k.rotated_from,
            k.rotation_root,
            k.credits_only,
            k.monthly_spend_limit_cents,
            k.rate_limit_rpm
        ],
    )
}

pub(in crate::store) fn get_key(c: &Connection, id: &str) -> rusqlite::Result<Option<KeyRecord>> {
    c.query_row(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?1"), [id], key_from_row).optional()
}

pub(in crate::store) fn scope_keys(c: &Connection, ws: &str, scope: KeyScope) -> rusqlite::Result<Vec<KeyRecord>> {
    let mut st =
        c.prepare_cached(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE workspace_id = ?1 AND scope = ?2"))?;
    let rows = st.query_map(params![ws, scope.as_str()], key_from_row)?;
    rows.collect()
}
