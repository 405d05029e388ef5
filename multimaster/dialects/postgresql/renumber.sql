-- multimaster: renumbering at insert (PostgreSQL) for $table. A new row takes the next rank:
-- base + number of identities known (deleted ones included). Inserting transactions of this
-- table take a transaction-level advisory lock (so do the reconciler's), held until COMMIT: a
-- rolled-back insert never leaves a gap, and keys follow the order of identities. Rows of one
-- statement reach the shadow only at the end of the statement; mm.k<oid> remembers the last key
-- given in this transaction. The key column's own sequence is kept past every key given.
-- SECURITY DEFINER with a fixed search_path, like the capture functions (capture.sql).
CREATE OR REPLACE FUNCTION $fn_rank() RETURNS trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  k bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(28013, TG_RELID::int);
  k := greatest((SELECT max(key) FROM $shadow),
                nullif(current_setting('mm.k' || TG_RELID, true), '')::bigint, 0) + 1;
  PERFORM set_config('mm.k' || TG_RELID, k::text, true);$seqfix
  NEW.$key := k;
  RETURN NEW;
END
$$;
--
REVOKE ALL ON FUNCTION $fn_rank() FROM PUBLIC;
--
DROP TRIGGER IF EXISTS $rank ON $table;
--
CREATE TRIGGER $rank BEFORE INSERT ON $table FOR EACH ROW
  WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION $fn_rank();
