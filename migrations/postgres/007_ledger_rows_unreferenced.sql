-- Decision 195: the per-request rows (holds, ledger entries) no longer carry a foreign key
-- to workspaces. Each inserted row made PostgreSQL run a referential check (a query that
-- locks the workspace row FOR KEY SHARE) at the end of the batch's statement: a quarter of
-- the database's CPU per request. Every path that writes these rows has read the workspace
-- row in the same transaction (the batch locks it FOR UPDATE; a top-up updates it first)
-- and writes nothing for a workspace it did not find, and workspaces are never deleted.
ALTER TABLE holds DROP CONSTRAINT IF EXISTS holds_workspace_id_fkey;
ALTER TABLE ledger_entries DROP CONSTRAINT IF EXISTS ledger_entries_workspace_id_fkey;
