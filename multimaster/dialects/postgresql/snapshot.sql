-- multimaster: snapshot at this site of peer $peer's change log of table $table.
CREATE TABLE IF NOT EXISTS $snap (
  pseq bigint PRIMARY KEY,
  ver text COLLATE "C" NOT NULL,
  origin text NOT NULL,
  op char(1) NOT NULL,
  rid text COLLATE "C" NOT NULL,
  key $keytype,
  mask bigint NOT NULL$logcols,
  applied smallint NOT NULL DEFAULT 0,
  txn text,  -- (the ALTERs below and install_snapshot add these to a snapshot created before them)
  pending text,
  sup text,
  misfit text  -- values of a held change this site cannot store exactly (engine/pull.py)
);
--
ALTER TABLE $snap ADD COLUMN IF NOT EXISTS txn text;  -- the entry's source transaction (relays copy it)
--
-- values of columns this site does not have yet, the change waits for (docs/schema-changes.md)
ALTER TABLE $snap ADD COLUMN IF NOT EXISTS pending text;
--
CREATE INDEX IF NOT EXISTS $snap_idx ON $snap (applied) WHERE applied <> 1;
--
-- a change is found in a snapshot by its version (holding, releasing and relaying changes, a
-- refresh's look for what it has here): without this index each lookup read the whole snapshot,
-- and holding N changes beside M stored ones took N * M (MariaDB: 1,200 held beside 6,000 stored,
-- 236 s; docs/performance.md)
CREATE INDEX IF NOT EXISTS $snap_ver ON $snap (ver);
