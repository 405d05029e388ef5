-- multimaster: snapshot at this site of peer $peer's change log of table $table.
CREATE TABLE IF NOT EXISTS $snap (
  pseq INTEGER PRIMARY KEY,
  ver TEXT NOT NULL,
  origin TEXT NOT NULL,
  op TEXT NOT NULL,
  rid TEXT NOT NULL,
  key $keytype,
  mask INTEGER NOT NULL$logcols,
  applied INTEGER NOT NULL DEFAULT 0
);
--
CREATE INDEX IF NOT EXISTS $snap_idx ON $snap (applied) WHERE applied <> 1;
