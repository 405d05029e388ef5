-- multimaster: keys of local inserts (PostgreSQL) into the renumbered table $table. A new row takes
-- the next value of the table's key counter $keyseq, whatever key the statement gave (the key is
-- the framework's). Writers never wait for each other: every writer takes the table's writers'
-- lock in shared mode, held until COMMIT, before it locks or writes any row of the table: an
-- inserted row in this key function, before its key is drawn (a row trigger: a statement that
-- inserts nothing takes nothing); an UPDATE or DELETE statement in the trigger named by lock
-- (FOR EACH STATEMENT, _mm._mm_lock in site.sql), before its first row. The reconciler takes it
-- exclusively when it gives keys (Dialect.lock_writers): then no local insert is in flight, and
-- it turns the keys drawn here into ranks in insertion order (a rolled-back insert leaves a gap;
-- two inserts may draw key and version in opposite orders: engine/apply.py normalize_keys) and
-- sets the counter back to the highest key. Taken by updates and deletes too, and always before
-- any row lock of the table: a writer holding one of the table's rows holds the shared lock
-- already, so the reconciler, once it holds the lock, never waits for a row of a writer that waits
-- for it (no deadlock whose victim would be an application). (Inserts took it in the statement
-- trigger too until session 24: in the key function it costs a one-row insert 11,400 instructions
-- less, a statement trigger's call; docs/decisions.md.)
-- The key function lets the reconciler's own inserts pass itself (mm.applying), without a WHEN
-- clause, which PostgreSQL prepares again for every statement (capture.sql): for each row the
-- reconciler inserts it runs and returns at once. It is SECURITY DEFINER (applications need no
-- right on the counter) without the fixed search_path of the capture functions: every name in it
-- is schema-qualified, operators included, so a caller's search_path cannot reach into it, and a
-- function without a SET clause is entered without saving and restoring settings (~12,000
-- instructions a call, paid for every row inserted). Figures: docs/decisions.md "PostgreSQL: the
-- echo guard inside the functions". The lock is taken by an assignment, not PERFORM (site.sql).
CREATE SEQUENCE IF NOT EXISTS $keyseq AS bigint MINVALUE 0 START WITH 1;
--
CREATE OR REPLACE FUNCTION $fn_rank() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER AS $$
DECLARE
  done text;
BEGIN
  IF pg_catalog.current_setting('mm.applying', true) OPERATOR(pg_catalog.=) 'on' THEN
    RETURN NEW;  -- a row the reconciler writes keeps its key
  END IF;
  done := pg_catalog.pg_advisory_xact_lock_shared(28013, TG_RELID::int);  -- the writers' lock
  NEW.$key := pg_catalog.nextval($keyseq_lit);
  RETURN NEW;
END
$$;
--
REVOKE ALL ON FUNCTION $fn_rank() FROM PUBLIC;
--
DROP TRIGGER IF EXISTS $rank ON $table;
--
CREATE TRIGGER $rank BEFORE INSERT ON $table FOR EACH ROW
  EXECUTE FUNCTION $fn_rank();
--
CREATE TRIGGER $lock BEFORE UPDATE OR DELETE ON $table FOR EACH STATEMENT
  EXECUTE FUNCTION _mm._mm_lock();
