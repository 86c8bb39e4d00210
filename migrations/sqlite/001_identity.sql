-- Workspaces, API keys (digest + encrypted copy, never plaintext), key copy audit.
-- Instants are Unix milliseconds.
CREATE TABLE workspaces (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    rate_tier TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    frozen TEXT,
    lifetime_purchases_cents INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    name TEXT,
    scope TEXT NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    format_version INTEGER NOT NULL,
    encrypted_copy BLOB,
    created_by TEXT,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER,
    grace_until INTEGER,
    rotated_from TEXT,
    rotation_root TEXT NOT NULL,
    credits_only INTEGER NOT NULL DEFAULT 0,
    monthly_spend_limit_cents INTEGER,
    rate_limit_rpm INTEGER
);

CREATE INDEX api_keys_by_scope ON api_keys (workspace_id, scope);

CREATE TABLE key_copy_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key_id TEXT NOT NULL,
    actor TEXT NOT NULL,
    role TEXT NOT NULL,
    at INTEGER NOT NULL
);
