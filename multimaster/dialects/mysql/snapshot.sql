-- multimaster: snapshot at this site of peer $peer's change log of table $table.
CREATE TABLE IF NOT EXISTS $snap (
  pseq BIGINT PRIMARY KEY,
  ver VARCHAR(255) NOT NULL,
  origin VARCHAR(64) NOT NULL,
  op CHAR(1) NOT NULL,
  rid VARCHAR(255) NOT NULL,
  `key` $keytype,
  mask BIGINT NOT NULL$logcols,
  applied SMALLINT NOT NULL DEFAULT 0,
  txn VARCHAR(64),  -- (the ALTERs below and install_snapshot add these to a snapshot created before them)
  pending LONGTEXT,
  sup LONGTEXT,
  misfit LONGTEXT,  -- values of a held change this site cannot store exactly (engine/pull.py)
  KEY $snap_idx (applied)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
ALTER TABLE $snap ADD COLUMN IF NOT EXISTS txn VARCHAR(64);  -- the entry's source transaction (relays copy it)
--
-- values of columns this site does not have yet, the change waits for (docs/schema-changes.md)
ALTER TABLE $snap ADD COLUMN IF NOT EXISTS pending LONGTEXT;
--
-- a change is found in a snapshot by its version (holding, releasing and relaying changes, a
-- refresh's look for what it has here): without this index each lookup read the whole snapshot,
-- and holding N changes beside M stored ones took N * M (MariaDB: 1,200 held beside 6,000 stored,
-- 236 s; docs/performance.md)
CREATE INDEX IF NOT EXISTS $snap_ver ON $snap (ver);
