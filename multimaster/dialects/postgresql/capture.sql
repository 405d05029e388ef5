-- multimaster: capture triggers (PostgreSQL) on $table. Statement-level AFTER triggers read the
-- transition tables, so a multi-row statement is captured with a few set-based statements.
-- Writers of the table never wait for each other (docs/concepts.md "Many writers"): each function
-- registers its transaction once (_mm._mm_register, site.sql), then every captured row
-- draws one tick of the clock, which is both its change-log position (seq) and, formatted, its
-- version. The tick is drawn in a subquery kept apart by OFFSET 0, so it is computed once per row.
-- Updates and deletes draw it after the row lock (AFTER trigger): a change that overwrote another's
-- committed write has a later version. Writers of a renumbered table also take the table's
-- writers' lock in shared mode (renumber.sql).
-- Each entry records its source transaction (txn, pg_current_xact_id(): 64 bits, never wraps), so
-- a peer applies the transaction whole (docs/transactions.md).
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
  IF coalesce(current_setting('mm.lo', true), '') = '' THEN
    PERFORM _mm._mm_register();
  END IF;
  WITH l AS (
    INSERT INTO $log (seq, ver, origin, op, rid, key, mask, txn, sv$ncols)
      SELECT n.mm_t, n.mm_v, $site_lit, 'I', $insrid, n.$key, $allmask, pg_current_xact_id()::text, $sv$newvals
      FROM (SELECT lpad(m.mm_t::text, 19, '0') || ':' || $site_lit AS mm_v, m.*
            FROM (SELECT _mm._mm_tick() AS mm_t, r.* FROM (SELECT * FROM mm_new ORDER BY $key OFFSET 0) r OFFSET 0) m) n
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
  IF coalesce(current_setting('mm.lo', true), '') = '' THEN
    PERFORM _mm._mm_register();
  END IF;
  WITH l AS (
    INSERT INTO $log (seq, ver, origin, op, rid, key, mask, txn, sv$ncols$ocols)
      SELECT x.mm_t, lpad(x.mm_t::text, 19, '0') || ':' || $site_lit, $site_lit, 'U', x.mm_rid, x.mm_k, x.mm_m, pg_current_xact_id()::text, $sv$xupd
      FROM (SELECT _mm._mm_tick() AS mm_t, s.rid AS mm_rid, n.$key AS mm_k, $updmask AS mm_m$updvals
            FROM mm_new n JOIN mm_old o ON o.$key = n.$key LEFT JOIN $shadow s ON s.key = n.$key$live
            WHERE $anychanged OFFSET 0) x
      RETURNING key, ver, mask)
  UPDATE $shadow s SET $slotstamp FROM l WHERE s.key = l.key$live;
  RETURN NULL;
END
$$;
--
CREATE OR REPLACE FUNCTION $fn_cap_d() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF coalesce(current_setting('mm.lo', true), '') = '' THEN
    PERFORM _mm._mm_register();
  END IF;
  WITH l AS (
    INSERT INTO $log (seq, ver, origin, op, rid, key, mask, txn, sv$ocols)
      SELECT x.mm_t, lpad(x.mm_t::text, 19, '0') || ':' || $site_lit, $site_lit, 'D', x.mm_rid, x.mm_k, $allmask, pg_current_xact_id()::text, $sv$xdel
      FROM (SELECT _mm._mm_tick() AS mm_t, s.rid AS mm_rid, o.$key AS mm_k$delvals
            FROM mm_old o LEFT JOIN $shadow s ON s.key = o.$key$live OFFSET 0) x
      RETURNING key, ver)
  UPDATE $shadow s SET deleted = l.ver FROM l WHERE s.key = l.key$live;
  RETURN NULL;
END
$$;
--
-- Only the triggers init creates may run them (as their owner): no one else may attach them.
REVOKE ALL ON FUNCTION $fn_cap_i(), $fn_cap_u(), $fn_cap_d() FROM PUBLIC;
--
-- (earlier versions locked the table for every captured statement here; renumber.sql creates the
-- writers' lock of renumbered tables under this name)
DROP TRIGGER IF EXISTS $lock ON $table;
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
