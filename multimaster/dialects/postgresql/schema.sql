-- multimaster: the schema guard (PostgreSQL), docs/schema-changes.md. An event trigger at the end
-- of every ALTER TABLE, in its transaction: for a replicated table (in _mm._mm_tables),
--  * a column the capture functions name and the table no longer has (DROP COLUMN) is replaced in
--    their bodies by a NULL of its type (as n."c" / o."c" in the statements on the transition tables,
--    also inside the string the insert and delete functions EXECUTE, as mm_r."c" in their one-row
--    path, and as NEW."c" / OLD."c" in the update's row function, capture.sql), so the
--    application's next INSERT, UPDATE or DELETE is
--    captured (the entries carry NULL there, as a site without the column reads them) instead of
--    failing; the next refresh makes the functions again for the new schema version (engine/evolve.py);
--  * a column whose type changed gets the new type in the change log too, where its values fit
--    (a widened column's longer values are captured); a narrowing is refused by the next refresh.
-- Only a superuser may create it (init skips it otherwise: capture then follows at the next
-- refresh, and a column is dropped with `multimaster ddl`). The function runs as its owner.
CREATE OR REPLACE FUNCTION _mm._mm_follow_alter() RETURNS event_trigger LANGUAGE plpgsql
  SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
  tname text;
  cols text;
  c text;
  typ text;
  ltyp text;
  logrel regclass;
  fdef text;
  fname text;
  qc text;
  ref text;
  nulled text;
BEGIN
  FOR r IN SELECT DISTINCT objid FROM pg_event_trigger_ddl_commands() WHERE object_type = 'table' LOOP
    SELECT relname INTO tname FROM pg_class WHERE oid = r.objid;
    CONTINUE WHEN tname IS NULL OR tname LIKE '\_mm\_%';
    SELECT t.columns INTO cols FROM _mm._mm_tables t WHERE t.tbl = tname;
    CONTINUE WHEN cols IS NULL;
    logrel := to_regclass('_mm.' || quote_ident('_mm_log_' || tname));
    CONTINUE WHEN logrel IS NULL;
    FOR c IN SELECT x FROM json_array_elements_text(cols::json) x LOOP
      typ := NULL;
      SELECT format_type(a.atttypid, a.atttypmod) INTO typ FROM pg_attribute a
        WHERE a.attrelid = r.objid AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped;
      SELECT format_type(a.atttypid, a.atttypmod) INTO ltyp FROM pg_attribute a
        WHERE a.attrelid = logrel AND a.attname = 'n_' || c AND NOT a.attisdropped;
      IF typ IS NULL THEN
        qc := '"' || replace(c, '"', '""') || '"';
        FOREACH fname IN ARRAY ARRAY['_mm_cap_i_', '_mm_cap_u_', '_mm_cap_d_'] LOOP
          fdef := NULL;
          SELECT pg_get_functiondef(p.oid) INTO fdef FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = '_mm' AND p.proname = fname || tname;
          CONTINUE WHEN fdef IS NULL;
          nulled := fdef;
          FOREACH ref IN ARRAY ARRAY['n.' || qc, 'o.' || qc, 'NEW.' || qc, 'OLD.' || qc, 'mm_r.' || qc,
                                     'n.' || replace(qc, '''', ''''''), 'o.' || replace(qc, '''', '''''')] LOOP
            nulled := replace(nulled, ref, 'NULL::' || ltyp);
          END LOOP;
          CONTINUE WHEN nulled = fdef;  -- this function does not name the column
          EXECUTE nulled;
        END LOOP;
      ELSIF typ IS DISTINCT FROM ltyp AND ltyp NOT IN ('text', 'bigint') THEN
        BEGIN
          EXECUTE 'ALTER TABLE ' || logrel::text || ' ALTER COLUMN ' || quote_ident('n_' || c) || ' TYPE ' || typ
            || ', ALTER COLUMN ' || quote_ident('o_' || c) || ' TYPE ' || typ;
        EXCEPTION WHEN others THEN
          NULL;  -- values of the change log that do not fit the new type: the next refresh refuses it
        END;
      END IF;
    END LOOP;
  END LOOP;
END
$$;
--
REVOKE ALL ON FUNCTION _mm._mm_follow_alter() FROM PUBLIC;
--
DROP EVENT TRIGGER IF EXISTS _mm_follow_alter;
--
CREATE EVENT TRIGGER _mm_follow_alter ON ddl_command_end WHEN TAG IN ('ALTER TABLE')
  EXECUTE FUNCTION _mm._mm_follow_alter();
