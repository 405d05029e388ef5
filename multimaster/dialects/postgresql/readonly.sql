-- multimaster: a read-only site (PostgreSQL; docs/topologies.md "Read-only sites"). Applications
-- cannot insert, update, delete or truncate rows of $table here: it is written by replication
-- only. Statement-level triggers (_mm._mm_readonly in site.sql raises read_only_sql_transaction)
-- refuse the statement before it touches a row; the reconciler's own writes pass (it sets
-- mm.applying = 'on' in its transaction).
DROP TRIGGER IF EXISTS $ro_i ON $table;
--
DROP TRIGGER IF EXISTS $ro_u ON $table;
--
DROP TRIGGER IF EXISTS $ro_d ON $table;
--
CREATE TRIGGER $ro_i BEFORE INSERT ON $table FOR EACH STATEMENT
  WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION _mm._mm_readonly($site_lit);
--
CREATE TRIGGER $ro_u BEFORE UPDATE ON $table FOR EACH STATEMENT
  WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION _mm._mm_readonly($site_lit);
--
CREATE TRIGGER $ro_d BEFORE DELETE OR TRUNCATE ON $table FOR EACH STATEMENT
  WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') EXECUTE FUNCTION _mm._mm_readonly($site_lit);
