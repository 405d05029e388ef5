-- multimaster: capture triggers (PostgreSQL) on $table. Statement-level AFTER triggers read the
-- transition tables, so a multi-row statement is captured with a few set-based statements.
-- Every captured statement first takes the table's advisory lock, held until COMMIT: the
-- statement-level trigger _mm_lock, except for INSERT on renumbered tables, where the rank trigger
-- (renumber.sql, BEFORE INSERT FOR EACH ROW) takes it before each row goes in: every row an
-- INSERT, INSERT ... SELECT or COPY writes, and so every change-log entry, is written under it.
-- The echo guard skips changes the reconciler applies: it runs SET LOCAL mm.applying = 'on' in its
-- own transaction, which no other session ever sees.
-- The functions run as their owner (SECURITY DEFINER: the role that ran init), so applications
-- need no privilege on _mm (docs/postgresql.md), with a fixed search_path of pg_catalog and
-- pg_temp only: every other name is schema-qualified, and values compare with the built-in
-- operators (a citext column as text: a change of letter case is captured).
-- A natural-key table's shadow holds one row per incarnation of a key: $live restricts updates
-- and deletes to the live one (deleted IS NULL); $replaced ends one an insert supersedes.
CREATE OR REPLACE FUNCTION $fn_cap_i() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  WITH l AS (
    INSERT INTO $log (ver, origin, op, rid, key, mask$ncols)
      SELECT n.mm_v, $site_lit, 'I', $insrid, n.$key, $allmask$newvals
      FROM (SELECT _mm._mm_ver() AS mm_v, r.* FROM (SELECT * FROM mm_new ORDER BY $key OFFSET 0) r OFFSET 0) n
      RETURNING rid, key, ver)$replaced
  INSERT INTO $shadow (rid, key$slotnames)
    SELECT rid, key$slotinit FROM l;
  RETURN NULL;
END
$$;
--
CREATE OR REPLACE FUNCTION $fn_cap_u() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  WITH l AS (
    INSERT INTO $log (ver, origin, op, rid, key, mask$ncols$ocols)
      SELECT _mm._mm_ver(), $site_lit, 'U', s.rid, n.$key, $updmask$updnew$updold
      FROM mm_new n JOIN mm_old o ON o.$key = n.$key LEFT JOIN $shadow s ON s.key = n.$key$live
      WHERE $anychanged
      RETURNING key, ver, mask)
  UPDATE $shadow s SET $slotstamp FROM l WHERE s.key = l.key$live;
  RETURN NULL;
END
$$;
--
CREATE OR REPLACE FUNCTION $fn_cap_d() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  WITH l AS (
    INSERT INTO $log (ver, origin, op, rid, key, mask$ocols)
      SELECT _mm._mm_ver(), $site_lit, 'D', s.rid, o.$key, $allmask$oldvals
      FROM mm_old o LEFT JOIN $shadow s ON s.key = o.$key$live
      RETURNING key, ver)
  UPDATE $shadow s SET deleted = l.ver FROM l WHERE s.key = l.key$live;
  RETURN NULL;
END
$$;
--
-- Only the triggers init creates may run them (as their owner): no one else may attach them.
REVOKE ALL ON FUNCTION $fn_cap_i(), $fn_cap_u(), $fn_cap_d() FROM PUBLIC;
--
DROP TRIGGER IF EXISTS $lock ON $table;
--
CREATE TRIGGER $lock BEFORE $lockevents ON $table FOR EACH STATEMENT
  WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION _mm._mm_lock();
--
DROP TRIGGER IF EXISTS $cap_i ON $table;
--
CREATE TRIGGER $cap_i AFTER INSERT ON $table REFERENCING NEW TABLE AS mm_new FOR EACH STATEMENT
  WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION $fn_cap_i();
--
DROP TRIGGER IF EXISTS $cap_u ON $table;
--
CREATE TRIGGER $cap_u AFTER UPDATE ON $table REFERENCING OLD TABLE AS mm_old NEW TABLE AS mm_new FOR EACH STATEMENT
  WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION $fn_cap_u();
--
DROP TRIGGER IF EXISTS $cap_d ON $table;
--
CREATE TRIGGER $cap_d AFTER DELETE ON $table REFERENCING OLD TABLE AS mm_old FOR EACH STATEMENT
  WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION $fn_cap_d();
--
DROP TRIGGER IF EXISTS $keyguard ON $table;
--
CREATE TRIGGER $keyguard BEFORE UPDATE OF $key ON $table FOR EACH ROW
  WHEN (OLD.$key IS DISTINCT FROM NEW.$key AND current_setting('mm.applying', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION _mm._mm_keyguard($keyname_lit);
