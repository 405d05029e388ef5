-- multimaster: capture triggers (SQLite) on $table. The echo guard skips changes the reconciler
-- applies (it sets _mm_state.applying = 1 inside its own write transaction).
-- The clock: hlc = max(hlc + 1, wall-clock ms * 65536), see docs/clock.md.
CREATE TRIGGER IF NOT EXISTS $cap_i AFTER INSERT ON $table
WHEN (SELECT applying FROM _mm_state) = 0
BEGIN
  UPDATE _mm_state SET hlc = max(hlc + 1, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) * 65536);
$renumber
  INSERT INTO $log (ver, origin, op, rid, key, mask$ncols)
    SELECT printf('%019d:%s', hlc, site), site, 'I', $insrid, $newkey, $allmask$newvals FROM _mm_state;
  INSERT INTO $shadow (rid, key$slotnames)
    SELECT $insrid, $newkey$slotinit FROM _mm_state;
END;
--
CREATE TRIGGER IF NOT EXISTS $cap_u AFTER UPDATE ON $table
WHEN (SELECT applying FROM _mm_state) = 0 AND ($anychanged)
BEGIN
  UPDATE _mm_state SET hlc = max(hlc + 1, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) * 65536);
  INSERT INTO $log (ver, origin, op, rid, key, mask$ncols$ocols)
    SELECT printf('%019d:%s', hlc, site), site, 'U', (SELECT rid FROM $shadow WHERE key = NEW.$key), NEW.$key, $updmask$updnew$updold FROM _mm_state;
  UPDATE $shadow SET $slotstamp WHERE key = NEW.$key;
END;
--
CREATE TRIGGER IF NOT EXISTS $cap_d AFTER DELETE ON $table
WHEN (SELECT applying FROM _mm_state) = 0
BEGIN
  UPDATE _mm_state SET hlc = max(hlc + 1, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) * 65536);
  INSERT INTO $log (ver, origin, op, rid, key, mask$ocols)
    SELECT printf('%019d:%s', hlc, site), site, 'D', (SELECT rid FROM $shadow WHERE key = OLD.$key), OLD.$key, $allmask$oldvals FROM _mm_state;
  UPDATE $shadow SET deleted = (SELECT printf('%019d:%s', hlc, site) FROM _mm_state) WHERE key = OLD.$key;
END;
--
CREATE TRIGGER IF NOT EXISTS $keyguard BEFORE UPDATE OF $key ON $table
WHEN (SELECT applying FROM _mm_state) = 0 AND NEW.$key IS NOT OLD.$key
BEGIN
  SELECT RAISE(ABORT, 'multimaster: the key column $keyname of $tablename is managed by replication and cannot be updated; delete and insert the row instead');
END;
