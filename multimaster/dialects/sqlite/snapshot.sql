-- multimaster: snapshot at this site of peer $peer's change log of table $table.
CREATE TABLE IF NOT EXISTS $snap (
  pseq INTEGER PRIMARY KEY,
  ver TEXT NOT NULL,
  origin TEXT NOT NULL,
  op TEXT NOT NULL,
  rid TEXT NOT NULL,
  key $keytype,
  mask INTEGER NOT NULL$logcols,
  txn TEXT,  -- the change's source transaction, as its origin named it (docs/transactions.md)
  applied INTEGER NOT NULL DEFAULT 0,
  pending TEXT,  -- values of columns this site does not have yet, the change waits for (docs/schema-changes.md)
  misfit TEXT  -- values of a held change this site cannot store exactly (engine/pull.py)
);
--
CREATE INDEX IF NOT EXISTS $snap_idx ON $snap (applied) WHERE applied <> 1;
--
-- a change is found in a snapshot by its version (holding, releasing and relaying changes, a
-- refresh's look for what it has here): without this index each lookup read the whole snapshot,
-- and holding N changes beside M stored ones took N * M (MariaDB: 1,200 held beside 6,000 stored,
-- 236 s; docs/performance.md)
CREATE INDEX IF NOT EXISTS $snap_ver ON $snap (ver);
