-- An operator's pause or resume of a model through the admin API, shared by every gateway
-- instance on this database and kept across restarts (issue 52). One row per model the
-- operator acted on: `paused_until` (Unix milliseconds) while paused, NULL once resumed
-- (a resume overrides a pause written in models.yaml). No row: models.yaml decides.
CREATE TABLE model_states (
    model        TEXT PRIMARY KEY,
    paused_until INTEGER,
    changed_at   INTEGER NOT NULL
);
