-- Coding plans. One row per workspace holding a plan: the terms an operator sets and the
-- metered counters (microcents of usage value at per-token rates). Every change of a row
-- happens under the workspace row's lock, like the money columns.
CREATE TABLE plans (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces(id),
    -- starter | pro | team
    tier TEXT NOT NULL,
    -- active | past_due | unpaid | disputed | canceled
    status TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    cancel_at INTEGER,
    grace_until INTEGER,
    credits_enabled INTEGER NOT NULL,
    cap_cents INTEGER,
    pending_tier TEXT,
    pending_effective_at INTEGER,
    updated_at INTEGER NOT NULL,
    five_hour_start INTEGER,
    five_hour_used INTEGER NOT NULL DEFAULT 0,
    week_start INTEGER NOT NULL,
    week_used INTEGER NOT NULL DEFAULT 0,
    day_start INTEGER NOT NULL,
    standby_used INTEGER NOT NULL DEFAULT 0,
    period_start INTEGER NOT NULL,
    period_used INTEGER NOT NULL DEFAULT 0,
    credits_month_start INTEGER NOT NULL,
    credits_spent INTEGER NOT NULL DEFAULT 0,
    plan_pending INTEGER NOT NULL DEFAULT 0,
    standby_pending INTEGER NOT NULL DEFAULT 0,
    credits_pending INTEGER NOT NULL DEFAULT 0,
    plan_running INTEGER NOT NULL DEFAULT 0,
    standby_running INTEGER NOT NULL DEFAULT 0
);

-- Who pays for a held request (pay_as_you_go | plan | credits | standby) and what it added
-- to that funding's pending commitments.
ALTER TABLE holds ADD COLUMN funding TEXT NOT NULL DEFAULT 'pay_as_you_go';
ALTER TABLE holds ADD COLUMN value_microcents INTEGER NOT NULL DEFAULT 0;
