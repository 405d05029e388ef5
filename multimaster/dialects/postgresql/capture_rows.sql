-- multimaster: the set-based capture statements of inserts and deletes (PostgreSQL), spliced by
-- capture.sql into its functions, once as a statement and once as a string for EXECUTE.
WITH l AS (
    INSERT INTO $log (seq, ver, origin, op, rid, key, mask, txn, sv$ncols)
      SELECT n.mm_t, n.mm_v, $site_lit, 'I', $insrid, n.$key, $allmask, pg_current_xact_id()::text, $sv$newvals
      FROM (SELECT lpad(m.mm_t::text, 19, '0') || ':' || $site_lit AS mm_v, m.*
            FROM (SELECT _mm._mm_tick() AS mm_t, r.* FROM (SELECT * FROM mm_new ORDER BY $key OFFSET 0) r OFFSET 0) m) n
      RETURNING rid, key, ver)$replaced
  INSERT INTO $shadow (rid, key$slotnames)
    SELECT rid, key$slotinit FROM l
--
WITH l AS (
    INSERT INTO $log (seq, ver, origin, op, rid, key, mask, txn, sv$ocols)
      SELECT x.mm_t, lpad(x.mm_t::text, 19, '0') || ':' || $site_lit, $site_lit, 'D', x.mm_rid, x.mm_k, $allmask, pg_current_xact_id()::text, $sv$xdel
      FROM (SELECT _mm._mm_tick() AS mm_t, s.rid AS mm_rid, o.$key AS mm_k$delvals
            FROM mm_old o LEFT JOIN $shadow s ON s.key = o.$key$live OFFSET 0) x
      RETURNING key, ver)
  UPDATE $shadow s SET deleted = l.ver FROM l WHERE s.key = l.key$live
