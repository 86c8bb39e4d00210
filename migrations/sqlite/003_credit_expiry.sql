-- Credit expiry: a top-up whose `expires_at` has passed is swept once; the unspent part of it
-- leaves the balance as an `expiry` entry, and the top-up is marked with when that happened.
ALTER TABLE ledger_entries ADD COLUMN expired_at INTEGER;
CREATE INDEX ledger_topups_due ON ledger_entries (expires_at) WHERE kind = 'topup' AND expired_at IS NULL;
