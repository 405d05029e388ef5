-- multimaster: capture triggers (MariaDB / MySQL) on $table. The echo guard skips changes the
-- reconciler applies: it sets the session variable @mm_applying = 1, which no other session sees.
-- The clock: hlc = max(hlc + 1, wall-clock ms * 65536), kept per table in _mm_clock (the
-- reconciler and add-site raise it past every version received); the UPDATE holds that row until
-- COMMIT (see docs/mysql.md). One UPDATE ticks it and hands the value over in @mm_c; on a
-- renumbered table the rank trigger (renumber.sql) ticked it already for the inserted row, in the
-- UPDATE that gave the key: the insert trigger takes that value, @mm_h, when @mm_t and @mm_k name
-- this table and this row (always false on natural-key tables), so a user trigger that writes
-- another replicated table in between cannot hand it a foreign value. (`@v := expr` inside an
-- expression is deprecated in MySQL 8.0.13+ but still supported; docs/mysql.md.)
-- A natural-key table's shadow holds one row per incarnation of a key: $live restricts updates and
-- deletes to the live one (deleted IS NULL); mm_r is a new row's incarnation ($ridinit).
DROP TRIGGER IF EXISTS $cap_i;
--
CREATE TRIGGER $cap_i AFTER INSERT ON $table FOR EACH ROW
BEGIN
  DECLARE mm_v VARCHAR(255);$ridvar
  IF coalesce(@mm_applying, 0) = 0 THEN
    IF $ranked THEN
      SET mm_v = CONCAT(LPAD(@mm_h, 19, '0'), ':', $site_lit);
    ELSE
      UPDATE _mm_clock SET hlc = (@mm_c := GREATEST(hlc + 1, CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) * 65536))
        WHERE tbl = $tbl_lit;
      SET mm_v = CONCAT(LPAD(@mm_c, 19, '0'), ':', $site_lit);
    END IF;$ridinit
    INSERT INTO $log (ver, origin, op, rid, `key`, mask$ncols)
      VALUES (mm_v, $site_lit, 'I', $insrid, NEW.$key, $allmask$newvals);$replaced
    INSERT INTO $shadow (rid, `key`$slotnames)
      VALUES ($insrid, NEW.$key$slotinit);
  END IF;
END;
--
DROP TRIGGER IF EXISTS $cap_u;
--
CREATE TRIGGER $cap_u AFTER UPDATE ON $table FOR EACH ROW
BEGIN
  DECLARE mm_v VARCHAR(255);
  IF coalesce(@mm_applying, 0) = 0 AND ($anychanged) THEN
    UPDATE _mm_clock SET hlc = (@mm_c := GREATEST(hlc + 1, CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) * 65536))
      WHERE tbl = $tbl_lit;
    SET mm_v = CONCAT(LPAD(@mm_c, 19, '0'), ':', $site_lit);
    INSERT INTO $log (ver, origin, op, rid, `key`, mask$ncols$ocols)
      VALUES (mm_v, $site_lit, 'U', (SELECT rid FROM $shadow WHERE `key` = NEW.$key$live), NEW.$key, $updmask$updnew$updold);
    UPDATE $shadow SET $slotstamp WHERE `key` = NEW.$key$live;
  END IF;
END;
--
DROP TRIGGER IF EXISTS $cap_d;
--
CREATE TRIGGER $cap_d AFTER DELETE ON $table FOR EACH ROW
BEGIN
  DECLARE mm_v VARCHAR(255);
  IF coalesce(@mm_applying, 0) = 0 THEN
    UPDATE _mm_clock SET hlc = (@mm_c := GREATEST(hlc + 1, CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) * 65536))
      WHERE tbl = $tbl_lit;
    SET mm_v = CONCAT(LPAD(@mm_c, 19, '0'), ':', $site_lit);
    INSERT INTO $log (ver, origin, op, rid, `key`, mask$ocols)
      VALUES (mm_v, $site_lit, 'D', (SELECT rid FROM $shadow WHERE `key` = OLD.$key$live), OLD.$key, $allmask$oldvals);
    UPDATE $shadow SET deleted = mm_v WHERE `key` = OLD.$key$live;
  END IF;
END;
--
DROP TRIGGER IF EXISTS $keyguard;
--
CREATE TRIGGER $keyguard BEFORE UPDATE ON $table FOR EACH ROW
BEGIN
  IF coalesce(@mm_applying, 0) = 0 AND NOT (OLD.$key <=> NEW.$key) THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = $keyguard_msg;
  END IF;
END;
