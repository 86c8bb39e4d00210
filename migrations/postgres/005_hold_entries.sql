-- Holds no longer write `hold` and `hold_release` ledger entries (decision 133): an open hold
-- is deducted from the stored balance and recorded by its row alone, so the stored balance
-- equals the sum of the entries less the open holds that wrote no entry. Holds placed before
-- this migration did write a `hold` entry; they are marked so their release writes the
-- matching `hold_release`.
ALTER TABLE holds ADD COLUMN entry_written BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE holds SET entry_written = TRUE WHERE amount_cents <> 0;
-- Only open holds are looked up by expiry: settled and released rows leave the index.
DROP INDEX holds_open_by_expiry;
CREATE INDEX holds_open_by_expiry ON holds (expires_at) WHERE state = 'open';
