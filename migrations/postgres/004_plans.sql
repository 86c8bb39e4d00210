-- Coding plans. One row per workspace holding a plan: the terms an operator sets and the
-- metered counters (microcents of usage value at per-token rates). Every change of a row
-- happens under the workspace row's lock, like the money columns.
CREATE TABLE plans (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces(id),
    -- starter | pro | team
    tier TEXT NOT NULL,
    -- active | past_due | unpaid | disputed | canceled
    status TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    cancel_at BIGINT,
    grace_until BIGINT,
    credits_enabled BOOLEAN NOT NULL,
    cap_cents BIGINT,
    pending_tier TEXT,
    pending_effective_at BIGINT,
    updated_at BIGINT NOT NULL,
    five_hour_start BIGINT,
    five_hour_used BIGINT NOT NULL DEFAULT 0,
    week_start BIGINT NOT NULL,
    week_used BIGINT NOT NULL DEFAULT 0,
    day_start BIGINT NOT NULL,
    standby_used BIGINT NOT NULL DEFAULT 0,
    period_start BIGINT NOT NULL,
    period_used BIGINT NOT NULL DEFAULT 0,
    credits_month_start BIGINT NOT NULL,
    credits_spent BIGINT NOT NULL DEFAULT 0,
    plan_pending BIGINT NOT NULL DEFAULT 0,
    standby_pending BIGINT NOT NULL DEFAULT 0,
    credits_pending BIGINT NOT NULL DEFAULT 0,
    plan_running BIGINT NOT NULL DEFAULT 0,
    standby_running BIGINT NOT NULL DEFAULT 0
);

-- Who pays for a held request (pay_as_you_go | plan | credits | standby) and what it added
-- to that funding's pending commitments.
ALTER TABLE holds ADD COLUMN funding TEXT NOT NULL DEFAULT 'pay_as_you_go';
ALTER TABLE holds ADD COLUMN value_microcents BIGINT NOT NULL DEFAULT 0;
