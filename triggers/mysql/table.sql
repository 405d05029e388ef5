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
-- The second-order log. seq2 is an AUTO_INCREMENT given while holding the table's _mm_clock row
-- lock, so entries commit in seq2 order and a peer can read everything committed.
CREATE TABLE IF NOT EXISTS $log2 (
  seq2 BIGINT AUTO_INCREMENT PRIMARY KEY,
  seq BIGINT NOT NULL,
  op CHAR(1) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
DROP TRIGGER IF EXISTS $l2a;
--
CREATE TRIGGER $l2a AFTER INSERT ON $log FOR EACH ROW
BEGIN
  UPDATE _mm_clock SET hlc = hlc WHERE tbl = $tbl_lit;
  INSERT INTO $log2 (seq, op) VALUES (NEW.seq, 'A');
END;
--
DROP TRIGGER IF EXISTS $l2p;
--
CREATE TRIGGER $l2p AFTER DELETE ON $log FOR EACH ROW
BEGIN
  UPDATE _mm_clock SET hlc = hlc WHERE tbl = $tbl_lit;
  INSERT INTO $log2 (seq, op) VALUES (OLD.seq, 'P');
END;
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
INSERT INTO _mm_clock (tbl) VALUES ($tbl_lit) ON DUPLICATE KEY UPDATE tbl = tbl;
