-- multimaster: per-table objects (MariaDB / MySQL) for table $table.
-- $logcols expands to one typed n_<col> / o_<col> pair per replicated column.
CREATE TABLE IF NOT EXISTS $log (
  seq BIGINT AUTO_INCREMENT PRIMARY KEY,
  ver VARCHAR(255) NOT NULL,
  origin VARCHAR(64) NOT NULL,
  op CHAR(1) NOT NULL,
  rid VARCHAR(255) NOT NULL,
  `key` $keytype,
  mask BIGINT NOT NULL$logcols,
  UNIQUE KEY (ver)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
-- The second-order log (docs/decisions.md "The second-order log is a view"):
-- every change-log entry is its own append record (seq2 = seq), with the columns the
-- trigger-filled table of earlier versions had, so peers read it with the same SQL. Sound because
-- every writer of the change log holds the table's _mm_clock row until COMMIT (the capture
-- triggers update it before they write the log; the reconciler locks it before it relays) and seq
-- is an AUTO_INCREMENT taken at insert: seq is handed out in commit order, so no entry can commit
-- below a position a peer already read. Purges are recorded in _mm_purges.horizon.
CREATE OR REPLACE VIEW $log2 AS
  SELECT seq AS seq2, seq, 'A' AS op FROM $log;
--
CREATE TABLE IF NOT EXISTS $shadow (
  rid VARCHAR(255) PRIMARY KEY,
  `key` $keytype NOT NULL,
  deleted VARCHAR(255)$slotcols,
  $keyindex
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
CREATE OR REPLACE VIEW $tombstones AS
  SELECT rid, `key`, deleted FROM $shadow WHERE deleted IS NOT NULL;
--
-- The table's clock starts at the site's floor (raised by add-site): the capture triggers read
-- only this row.
INSERT INTO _mm_clock (tbl, hlc) VALUES ($tbl_lit, coalesce((SELECT hlc FROM _mm_state WHERE id = 1), 0))
  ON DUPLICATE KEY UPDATE tbl = tbl;
