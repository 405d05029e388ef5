-- multimaster: per-table objects (SQLite) for table $table.
-- $logcols expands to one typed n_<col> / o_<col> pair per replicated column.
CREATE TABLE IF NOT EXISTS $log (
  seq INTEGER PRIMARY KEY,
  ver TEXT NOT NULL,
  origin TEXT NOT NULL,
  op TEXT NOT NULL CHECK (op IN ('I', 'U', 'D')),
  rid TEXT NOT NULL,
  key $keytype,
  mask INTEGER NOT NULL$logcols
);
--
CREATE TABLE IF NOT EXISTS $log2 (
  seq2 INTEGER PRIMARY KEY,  -- no AUTOINCREMENT: purge always keeps the newest entry, so no reuse
  seq INTEGER NOT NULL,
  op TEXT NOT NULL CHECK (op IN ('A', 'P'))
);
--
-- changes written by the applications' capture triggers; the reconciler adds the second-order
-- records of the changes it relays itself, set-based, for those some peer needs (docs/concepts.md)
CREATE TRIGGER IF NOT EXISTS $l2a AFTER INSERT ON $log
WHEN (SELECT applying FROM _mm_state) = 0
BEGIN
  INSERT INTO $log2 (seq, op) VALUES (NEW.seq, 'A');
END;
--
CREATE TRIGGER IF NOT EXISTS $l2p AFTER DELETE ON $log
BEGIN
  INSERT INTO $log2 (seq, op) VALUES (OLD.seq, 'P');
END;
--
CREATE TABLE IF NOT EXISTS $shadow (
  $shadowkeys,
  deleted TEXT$slotcols
);
--
CREATE VIEW IF NOT EXISTS $tombstones AS
  SELECT rid, key, deleted FROM $shadow WHERE deleted IS NOT NULL;
