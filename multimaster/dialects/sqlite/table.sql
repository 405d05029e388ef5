-- multimaster: per-table objects (SQLite) for table $table.
-- $logcols expands to one typed n_<col> / o_<col> pair per replicated column.
CREATE TABLE IF NOT EXISTS $log (
  seq INTEGER PRIMARY KEY,
  ver TEXT NOT NULL,
  origin TEXT NOT NULL,
  op TEXT NOT NULL CHECK (op IN ('I', 'U', 'D')),
  xrid TEXT,  -- the row's identity when it is not this entry's own version (updates, deletes, natural keys)
  rid TEXT GENERATED ALWAYS AS (coalesce(xrid, ver)) VIRTUAL,
  key $keytype,
  sv INTEGER,  -- the schema version the entry was written in (store/schemas.py; NULL: 1)
  txn TEXT,  -- a relayed entry's source transaction, as its origin named it; NULL in entries captured here (docs/transactions.md)
  mask INTEGER NOT NULL$logcols
);
--
-- The second-order log (docs/concepts.md, docs/decisions.md "The second-order log is a view"): on
-- SQLite the change log is append-only between purges and its seq only grows (purge keeps the
-- newest entry, so no rowid is reused), so every change log entry is its own append record
-- (seq2 = seq). A separate trigger-filled table costs a third B-tree page per single-row
-- transaction and cannot meet the capture floor; purges are recorded in _mm_purges.horizon.
CREATE VIEW IF NOT EXISTS $log2 AS
  SELECT seq AS seq2, seq, 'A' AS op FROM $log;
--
CREATE TABLE IF NOT EXISTS $shadow (
  $shadowkeys,
  deleted TEXT$slotcols
);
--
-- (natural keys: one shadow row per incarnation of a key, found by key)
$shadowindex
--
CREATE VIEW IF NOT EXISTS $tombstones AS
  SELECT rid, key, deleted FROM $shadow WHERE deleted IS NOT NULL;
