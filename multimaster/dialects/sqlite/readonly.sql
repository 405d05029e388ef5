-- multimaster: a read-only site (SQLite; docs/topologies.md "Read-only sites"). Applications
-- cannot insert, update or delete rows of $table here: it is written by replication only. The
-- reconciler's own writes pass (it sets the capture guard _mm_state.applying = 1 first). RAISE
-- (ABORT) undoes the statement, what other triggers did for it included.
DROP TRIGGER IF EXISTS $ro_i;
--
DROP TRIGGER IF EXISTS $ro_u;
--
DROP TRIGGER IF EXISTS $ro_d;
--
CREATE TRIGGER $ro_i BEFORE INSERT ON $table
WHEN (SELECT applying FROM _mm_state) = 0
BEGIN
  SELECT RAISE(ABORT, $message);
END;
--
CREATE TRIGGER $ro_u BEFORE UPDATE ON $table
WHEN (SELECT applying FROM _mm_state) = 0
BEGIN
  SELECT RAISE(ABORT, $message);
END;
--
CREATE TRIGGER $ro_d BEFORE DELETE ON $table
WHEN (SELECT applying FROM _mm_state) = 0
BEGIN
  SELECT RAISE(ABORT, $message);
END;
