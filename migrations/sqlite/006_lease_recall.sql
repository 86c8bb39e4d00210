-- A request the ledger refuses while leases (decision 187) hold part of the balance it needs
-- recalls them (decision 191): no lease is granted for the workspace before this time (Unix
-- milliseconds), so the instances holding one give it back within a second and the refused
-- request, retried, finds the balance. 0: never recalled.
ALTER TABLE workspaces ADD COLUMN leases_recalled_until INTEGER NOT NULL DEFAULT 0;
