-- multimaster: renumbering at insert (MariaDB / MySQL) for $table. A new row takes the next rank:
-- base + number of identities known (deleted ones included), counted in _mm_clock.maxkey under the
-- table's row lock (held until COMMIT: a rolled-back insert leaves no gap). The same UPDATE ticks
-- the table's clock for the row's change-log entry: the capture trigger (capture.sql) takes the
-- version from @mm_h when @mm_t / @mm_k show that this trigger ran for its row. `@v := expr`
-- inside an expression is deprecated in MySQL 8.0.13+ (still supported; docs/mysql.md).
DROP TRIGGER IF EXISTS $rank;
--
CREATE TRIGGER $rank BEFORE INSERT ON $table FOR EACH ROW
BEGIN
  IF coalesce(@mm_applying, 0) = 0 THEN
    UPDATE _mm_clock SET maxkey = (@mm_k := maxkey + 1),
        hlc = (@mm_h := GREATEST(hlc + 1, CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) * 65536))
      WHERE tbl = $tbl_lit;
    SET NEW.$key = @mm_k, @mm_t = $tbl_lit;
  END IF;
END;
