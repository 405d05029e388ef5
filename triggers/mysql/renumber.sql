-- multimaster: renumbering at insert (MariaDB / MySQL) for $table. A new row takes the next rank:
-- base + number of identities known (deleted ones included), counted in _mm_clock.maxkey under the
-- table's row lock (held until COMMIT: a rolled-back insert leaves no gap).
DROP TRIGGER IF EXISTS $rank;
--
CREATE TRIGGER $rank BEFORE INSERT ON $table FOR EACH ROW
BEGIN
  IF coalesce(@mm_applying, 0) = 0 THEN
    UPDATE _mm_clock SET maxkey = maxkey + 1 WHERE tbl = $tbl_lit;
    SET NEW.$key = (SELECT maxkey FROM _mm_clock WHERE tbl = $tbl_lit);
  END IF;
END;
