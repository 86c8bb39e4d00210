-- Credits ledger. Amounts: cents for balances, microcents (1 cent = 1,000,000) for costs.
-- The balance is derivable from the entries: balance_cents = SUM(amount_cents).
ALTER TABLE workspaces ADD COLUMN balance_cents INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workspaces ADD COLUMN held_cents INTEGER NOT NULL DEFAULT 0;
-- Fractional cent carried to the next settlement (0 <= carry < 1,000,000).
ALTER TABLE workspaces ADD COLUMN carry_microcents INTEGER NOT NULL DEFAULT 0;

CREATE TABLE ledger_entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    -- topup | hold | hold_release | settlement | adjustment
    kind TEXT NOT NULL,
    -- purchase | promo | grant (top-ups)
    source TEXT,
    amount_cents INTEGER NOT NULL,
    request_id TEXT,
    key_id TEXT,
    cost_microcents INTEGER,
    expires_at INTEGER,
    created_at INTEGER NOT NULL
);
CREATE INDEX ledger_by_workspace ON ledger_entries (workspace_id, created_at);
-- A request settles (and releases its hold) at most once.
CREATE UNIQUE INDEX ledger_once_per_request ON ledger_entries (request_id, kind) WHERE request_id IS NOT NULL;

CREATE TABLE holds (
    request_id TEXT PRIMARY KEY,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id),
    key_id TEXT,
    amount_cents INTEGER NOT NULL,
    -- open | settled | released
    state TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX holds_open_by_expiry ON holds (state, expires_at);

-- Settled spend per key and UTC month (the key spending limit).
CREATE TABLE key_month_spend (
    key_id TEXT NOT NULL,
    month TEXT NOT NULL,
    spent_microcents INTEGER NOT NULL,
    PRIMARY KEY (key_id, month)
);
