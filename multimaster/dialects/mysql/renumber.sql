-- multimaster: keys of local inserts (MariaDB) into the renumbered table $table. A new row takes
-- the next value of the table's key counter $keyseq, whatever key the statement gave (the key is
-- the framework's). Before the key is drawn the row draws its change-log position through its
-- connection's slot ($draw, capture.sql), which locks the slot until COMMIT: the reconciler, when
-- it gives keys, locks every slot of the table (Dialect.lock_writers), so no local insert is in
-- flight while it ranks the keys drawn here (a rolled-back insert leaves a gap; two inserts may draw
-- key and version in opposite orders: engine/apply.py normalize_keys) and sets the counter back to
-- the highest key. The insert trigger takes the position from $posvar, the table's own session
-- variable (capture.sql). @mm_h, @mm_k and @mm_t are what the insert trigger of the release before
-- read (the position when @mm_t / @mm_k named this table and row): init creates this trigger before
-- the insert trigger, so an insert in between is captured at this position too. `@v := expr`
-- inside an expression is deprecated in MySQL 8.0.13+ (still supported; docs/mysql.md).
-- The key counter (a CYCLE SEQUENCE) is made before this, past every key (dialect.py _key_counter).
DROP TRIGGER IF EXISTS $rank;
--
CREATE TRIGGER $rank BEFORE INSERT ON $table FOR EACH ROW
BEGIN
  IF coalesce(@mm_applying, 0) = 0 THEN
    $draw
    SET NEW.$key = NEXTVAL($keyseq);
    SET $posvar = @mm_p, @mm_h = @mm_p, @mm_k = NEW.$key, @mm_t = $tbl_lit;
  END IF;
END;
