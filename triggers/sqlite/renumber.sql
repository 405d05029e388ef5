  -- the new row takes the next rank: base + number of identities known (deleted ones included)
  UPDATE _mm_state SET applying = 1 WHERE NEW.$key IS NOT (SELECT coalesce(max(key), 0) + 1 FROM $shadow);
  UPDATE $table SET $key = (SELECT coalesce(max(key), 0) + 1 FROM $shadow)
    WHERE $key = NEW.$key AND (SELECT applying FROM _mm_state) = 1;
  UPDATE _mm_state SET applying = 0 WHERE applying = 1;
