-- multimaster: a read-only site (MariaDB; docs/topologies.md "Read-only sites"). Applications
-- cannot insert, update or delete rows of $table here: it is written by replication only. The
-- reconciler's own writes pass (it sets @mm_applying = 1 in its session). The insert guard fires
-- before the key trigger of a renumbered table ($precedes), so a refused insert draws nothing.
-- init run again leaves unchanged triggers in place (DDL is not transactional here).
DROP TRIGGER IF EXISTS $ro_i;
--
CREATE TRIGGER $ro_i BEFORE INSERT ON $table FOR EACH ROW $precedes
BEGIN
  IF coalesce(@mm_applying, 0) = 0 THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = $message;
  END IF;
END;
--
DROP TRIGGER IF EXISTS $ro_u;
--
CREATE TRIGGER $ro_u BEFORE UPDATE ON $table FOR EACH ROW
BEGIN
  IF coalesce(@mm_applying, 0) = 0 THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = $message;
  END IF;
END;
--
DROP TRIGGER IF EXISTS $ro_d;
--
CREATE TRIGGER $ro_d BEFORE DELETE ON $table FOR EACH ROW
BEGIN
  IF coalesce(@mm_applying, 0) = 0 THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = $message;
  END IF;
END;
