-- multimaster: catch the shadow of $table up with this site's own inserts (renumbered tables).
-- An insert writes no shadow row; the first update or delete of such a row, and every reconcile,
-- first copies the identities of the local inserts logged since the last catch-up.
CREATE TRIGGER IF NOT EXISTS $catch_u BEFORE UPDATE ON $table
WHEN (SELECT applying FROM _mm_state) = 0 AND NOT EXISTS (SELECT 1 FROM $shadow WHERE key = OLD.$key)
  AND NOT (NEW.$key IS NOT OLD.$key AND NEW.$key IS $lastinsertkey)
BEGIN
  $catchup
END;
--
CREATE TRIGGER IF NOT EXISTS $catch_d BEFORE DELETE ON $table
WHEN (SELECT applying FROM _mm_state) = 0 AND NOT EXISTS (SELECT 1 FROM $shadow WHERE key = OLD.$key)
BEGIN
  $catchup
END;
