-- multimaster: capture triggers (PostgreSQL) on $table.
-- Inserts and deletes are captured per statement: AFTER ... FOR EACH STATEMENT triggers read the
-- transition tables, so a multi-row statement is captured with a few set-based statements. A
-- statement of one row (an application's usual write) takes its row from the transition table and
-- writes the change-log row and the shadow's with two plain statements, as an update's row trigger
-- does: a set-based statement costs more to start than it saves on one row (docs/decisions.md,
-- "PostgreSQL capture"; benchmarks/bench_pg_insert_capture.py). A natural key's new incarnation
-- first ends the live one ($rowreplaced), then goes into the shadow, as the set-based CTE does. A
-- statement of no row captures nothing and does not register. A
-- plpgsql function plans such a statement once per session and keeps the plan, made for the size
-- of the transition table it first saw: made for 20,000 rows, every later single-row insert or
-- delete of the session scanned the whole shadow (docs/postgresql.md "Capture and plans"). So a
-- statement of at most $few rows runs the cached statement, whose plan is always made for a few
-- rows (index lookups), and a larger one runs the same text through EXECUTE, planned for its size.
-- Updates are captured per row (AFTER UPDATE ... FOR EACH ROW): pairing a statement's old and new
-- rows is a join of two transition tables, which have no index, so a cached plan made for one row
-- was quadratic for a bulk update (1.4 s for 5,000 rows) and one made for a bulk update cost every
-- later single-row update of the session a scan of the shadow; per row, a single-row update costs
-- less than the statement did and a bulk one as much.
-- Writers of the table never wait for each other (docs/concepts.md "Many writers"): each function
-- registers its transaction once, then every captured row draws one tick of the clock, which is
-- both its change-log position (seq) and, formatted, its version: a one-row statement runs
-- clock.sql's registration and draw inline ($register, $draw), a set-based one calls
-- _mm._mm_tick in a subquery kept apart by OFFSET 0, so it is computed once per row.
-- Updates and deletes draw it after the row lock (AFTER trigger; a row trigger's AFTER event runs
-- at the end of the statement): a change that overwrote another's committed write has a later
-- version. Writers of a renumbered table also take the table's writers' lock in shared mode
-- (renumber.sql).
-- Each entry records its source transaction (txn, pg_current_xact_id(): 64 bits, never wraps), so
-- a peer applies the transaction whole (docs/transactions.md).
-- The echo guard skips changes the reconciler applies: it runs SET LOCAL mm.applying = 'on' in its
-- own transaction, which no other session ever sees. The statement triggers' functions test it
-- first, instead of a WHEN clause: PostgreSQL reads and prepares a trigger's WHEN expression again
-- for every statement, about 24,000 instructions, while a plpgsql IF on it is a cached simple
-- expression. The row trigger of updates keeps its WHEN clause: without it, every row the
-- reconciler updates would call the function, which computes the row's mask first, ~20,000
-- instructions a row (docs/decisions.md "PostgreSQL: the echo guard inside the functions").
-- The functions run as their owner (SECURITY DEFINER: the role that ran init), so applications
-- need no privilege on _mm (docs/postgresql.md), with a fixed search_path of pg_catalog and
-- pg_temp only: every other name is schema-qualified, and values compare with the built-in
-- operators (a citext column as text: a change of letter case is captured).
-- A natural-key table's shadow holds one row per incarnation of a key: $live restricts updates
-- and deletes to the live one (deleted IS NULL); $replaced ends one an insert supersedes.
-- ($ins_stmt / $del_stmt are capture_rows.sql's statements, $ins_lit / $del_lit the same text as
-- a string literal for EXECUTE.)
CREATE OR REPLACE FUNCTION $fn_cap_i() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  mm_r record;
  mm_n int := 0;
  mm_t bigint;
  mm_lo bigint;  -- the registration's bound (clock.sql)
  mm_d text;  -- a void result (an assignment, not PERFORM: site.sql _mm_tick)
  mm_v text;
  mm_rid text;
BEGIN
  IF current_setting('mm.applying', true) = 'on' THEN
    RETURN NULL;
  END IF;
  FOR mm_r IN SELECT * FROM mm_new LIMIT 2 LOOP
    mm_n := mm_n + 1;
  END LOOP;
  IF mm_n = 0 THEN
    RETURN NULL;
  END IF;
  $register
  IF mm_n = 1 THEN
    $draw
    mm_v := lpad(mm_t::text, 19, '0') || ':' || $site_lit;
    mm_rid := $rowinsrid;
    INSERT INTO $log (seq, ver, origin, op, rid, key, mask, txn, sv$ncols)
      VALUES (mm_t, mm_v, $site_lit, 'I', mm_rid, mm_r.$key, $allmask, pg_current_xact_id()::text, $sv$rowvals);$rowreplaced
    INSERT INTO $shadow (rid, key$slotnames) VALUES (mm_rid, mm_r.$key$rowslotinit);
  ELSIF (SELECT count(*) FROM (SELECT FROM mm_new LIMIT $few + 1) c) <= $few THEN
    $ins_stmt;
  ELSE
    EXECUTE $ins_lit;
  END IF;
  RETURN NULL;
END
$$;
--
CREATE OR REPLACE FUNCTION $fn_cap_u() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  mm_m bigint := $rowmask;
  mm_t bigint;
  mm_lo bigint;  -- the registration's bound (clock.sql)
  mm_d text;  -- a void result (an assignment, not PERFORM: site.sql _mm_tick)
  mm_v text;
  mm_rid text;
  mm_sup text;
BEGIN
  IF mm_m = 0 THEN
    RETURN NULL;
  END IF;
  $register
  $draw
  mm_v := lpad(mm_t::text, 19, '0') || ':' || $site_lit;
  $rowsup
  UPDATE $shadow s SET $rowslotstamp WHERE s.key = NEW.$key$live RETURNING s.rid INTO mm_rid;
  INSERT INTO $log (seq, ver, origin, op, rid, key, mask, txn, sv, sup$ncols$ocols)
    VALUES (mm_t, mm_v, $site_lit, 'U', mm_rid, NEW.$key, mm_m, pg_current_xact_id()::text, $sv, mm_sup$rowupdnew$rowupdold);
  RETURN NULL;
END
$$;
--
CREATE OR REPLACE FUNCTION $fn_cap_d() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  mm_r record;
  mm_n int := 0;
  mm_t bigint;
  mm_lo bigint;  -- the registration's bound (clock.sql)
  mm_d text;  -- a void result (an assignment, not PERFORM: site.sql _mm_tick)
  mm_v text;
  mm_rid text;
BEGIN
  IF current_setting('mm.applying', true) = 'on' THEN
    RETURN NULL;
  END IF;
  FOR mm_r IN SELECT * FROM mm_old LIMIT 2 LOOP
    mm_n := mm_n + 1;
  END LOOP;
  IF mm_n = 0 THEN
    RETURN NULL;
  END IF;
  $register
  IF mm_n = 1 THEN
    $draw
    mm_v := lpad(mm_t::text, 19, '0') || ':' || $site_lit;
    mm_rid := (SELECT s.rid FROM $shadow s WHERE s.key = mm_r.$key$live);
    INSERT INTO $log (seq, ver, origin, op, rid, key, mask, txn, sv$ocols)
      VALUES (mm_t, mm_v, $site_lit, 'D', mm_rid, mm_r.$key, $allmask, pg_current_xact_id()::text, $sv$rowvals);
    UPDATE $shadow s SET deleted = mm_v WHERE s.key = mm_r.$key$live;
  ELSIF (SELECT count(*) FROM (SELECT FROM mm_old LIMIT $few + 1) c) <= $few THEN
    $del_stmt;
  ELSE
    EXECUTE $del_lit;
  END IF;
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
  EXECUTE FUNCTION $fn_cap_i();
--
DROP TRIGGER IF EXISTS $cap_u ON $table;
--
CREATE TRIGGER $cap_u AFTER UPDATE ON $table FOR EACH ROW
  WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION $fn_cap_u();
--
DROP TRIGGER IF EXISTS $cap_d ON $table;
--
CREATE TRIGGER $cap_d AFTER DELETE ON $table REFERENCING OLD TABLE AS mm_old FOR EACH STATEMENT
  EXECUTE FUNCTION $fn_cap_d();
--
DROP TRIGGER IF EXISTS $keyguard ON $table;
--
CREATE TRIGGER $keyguard BEFORE UPDATE OF $key ON $table FOR EACH ROW
  WHEN (OLD.$key IS DISTINCT FROM NEW.$key AND current_setting('mm.applying', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION _mm._mm_keyguard($keyname_lit);
