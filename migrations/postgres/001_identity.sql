-- Workspaces, API keys (digest + encrypted copy, never plaintext), key copy audit.
-- Instants are Unix milliseconds.
CREATE TABLE workspaces (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    rate_tier TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    frozen TEXT,
    lifetime_purchases_cents BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    name TEXT,
    scope TEXT NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    format_version INTEGER NOT NULL,
    encrypted_copy BYTEA,
    created_by TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    revoked_at BIGINT,
    grace_until BIGINT,
    rotated_from TEXT,
    rotation_root TEXT NOT NULL,
    credits_only BOOLEAN NOT NULL DEFAULT FALSE,
    monthly_spend_limit_cents BIGINT,
    rate_limit_rpm BIGINT
);

CREATE INDEX api_keys_by_scope ON api_keys (workspace_id, scope);

CREATE TABLE key_copy_audit (
    id BIGSERIAL PRIMARY KEY,
    key_id TEXT NOT NULL,
    actor TEXT NOT NULL,
    role TEXT NOT NULL,
    at BIGINT NOT NULL
);
