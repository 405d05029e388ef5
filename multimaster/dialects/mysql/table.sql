-- multimaster: per-table objects (MariaDB / MySQL) for table $table.
-- $logcols expands to one typed n_<col> / o_<col> pair per replicated column.
CREATE TABLE IF NOT EXISTS $log (
  seq BIGINT PRIMARY KEY,  -- the position: a value of _mm_tick drawn through the writer's slot (site.sql)
  ver VARCHAR(255) NOT NULL,
  origin VARCHAR(64) NOT NULL,
  op CHAR(1) NOT NULL CHECK (op IN ('I', 'U', 'D')),  -- MariaDB 10.2+ and MySQL 8.0.16+ enforce it
  rid VARCHAR(255) NOT NULL,
  `key` $keytype,
  mask BIGINT NOT NULL$logcols,
  txn VARCHAR(64),  -- (the ALTERs below add these to a log created before them)
  sv INT,
  sup LONGTEXT,
  UNIQUE KEY (ver)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
-- the source transaction of the entry (capture: '<connection>:0.', completed with the InnoDB
-- transaction id by a reader, site.sql _mm_stamp; a relayed entry keeps its origin's): a peer applies a transaction whole (docs/transactions.md)
ALTER TABLE $log ADD COLUMN IF NOT EXISTS txn VARCHAR(64);
--
-- the schema version the entry was written in (store/schemas.py; NULL: 1)
ALTER TABLE $log ADD COLUMN IF NOT EXISTS sv INT;
--
-- a refresh that reads a window of a long backlog asks which transactions it saw continue past
-- the window (engine/pull.py pull_link): found by transaction, not by scanning what follows
CREATE INDEX IF NOT EXISTS $log_txn ON $log (txn);
--
-- The second-order log (docs/decisions.md "The second-order log is a view"):
-- every change-log entry is its own append record (seq2 = seq), with the columns the
-- trigger-filled table of earlier versions had, so peers read it with the same SQL. Writers do not
-- commit in position order; a peer reads only below the horizon (_mm_horizon, site.sql), below
-- which every position is final, so no entry ever appears below a position a peer has read
-- (docs/mysql.md "How capture works with many writers"). Purges are recorded in _mm_purges.horizon.
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
-- The reconcilers' lock row of the table (Dialect.lock_for_apply) ...
INSERT INTO _mm_clock (tbl, hlc) VALUES ($tbl_lit, 0) ON DUPLICATE KEY UPDATE tbl = tbl;
--
-- ... and the gate of its writers' slots (site.sql _mm_gates).
INSERT INTO _mm_gates (tbl) VALUES ($tbl_lit) ON DUPLICATE KEY UPDATE tbl = tbl;
