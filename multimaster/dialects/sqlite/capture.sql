-- multimaster: capture triggers (SQLite) on $table. The echo guard skips changes the reconciler
-- applies (it sets _mm_state.applying = 1 inside its own write transaction).
-- The clock (docs/clock.md): a change's version takes max(wall-clock ms * 65536, the last change
-- log entry's clock + 1, the site's floor _mm_state.hlc + 1), so it never goes backwards and sorts
-- after everything this site has seen; reading the last entry costs no write.
-- The log inserts are INSERT ... VALUES with scalar subqueries ($ver is one): an INSERT ... SELECT
-- that reads the table it writes goes through a temporary table in SQLite (3 us per change).
-- Renumbered tables keep the shadow row of a new local row for later (catchup.sql): an insert then
-- writes only the change log and its second-order record. A natural-key table's shadow holds one
-- row per incarnation of a key ($live: updates and deletes act on the live one, deleted IS NULL).
-- On a table with a slot whose policy chooses among concurrent heads (docs/conflicts.md
-- "Concurrent heads"), an update records in sup the heads it supersedes, for each such slot it
-- sets (the version the shadow holds, '=' for the row's default, and the slot's other heads
-- h_<slot>), and $slotstamp clears them. Elsewhere $supcol / $supval are empty.
CREATE TRIGGER IF NOT EXISTS $cap_i AFTER INSERT ON $table
WHEN (SELECT applying FROM _mm_state) = 0
BEGIN
  INSERT INTO $log (ver, origin, op, xrid, key, sv, mask$ncols)
    VALUES ($ver, (SELECT site FROM _mm_state), 'I', $insrid, $newkey, $sv, $allmask$newvals);
$renumber
$shadowinsert
END;
--
CREATE TRIGGER IF NOT EXISTS $cap_u AFTER UPDATE ON $table
WHEN (SELECT applying FROM _mm_state) = 0 AND ($anychanged)
BEGIN
  INSERT INTO $log (ver, origin, op, xrid, key, sv, mask$ncols$ocols$supcol)
    VALUES ($ver, (SELECT site FROM _mm_state), 'U', (SELECT rid FROM $shadow WHERE key = NEW.$key$live), NEW.$key, $sv, $updmask$updnew$updold$supval);
  UPDATE $shadow SET $slotstamp WHERE key = NEW.$key$live;
END;
--
CREATE TRIGGER IF NOT EXISTS $cap_d AFTER DELETE ON $table
WHEN (SELECT applying FROM _mm_state) = 0
BEGIN
  INSERT INTO $log (ver, origin, op, xrid, key, sv, mask$ocols)
    VALUES ($ver, (SELECT site FROM _mm_state), 'D', (SELECT rid FROM $shadow WHERE key = OLD.$key$live), OLD.$key, $sv, $allmask$oldvals);
  UPDATE $shadow SET deleted = (SELECT ver FROM $log ORDER BY seq DESC LIMIT 1) WHERE key = OLD.$key$live;
END;
--
-- (the one key update let through: the insert trigger moving a new row to the key its change log
-- entry gives it; any other update to that key would collide with the row)
CREATE TRIGGER IF NOT EXISTS $keyguard BEFORE UPDATE OF $key ON $table
WHEN (SELECT applying FROM _mm_state) = 0 AND NEW.$key IS NOT OLD.$key AND NEW.$key IS NOT $lastinsertkey
BEGIN
  SELECT RAISE(ABORT, 'multimaster: the key column $keyname of $tablename is managed by replication and cannot be updated; delete and insert the row instead');
END;
