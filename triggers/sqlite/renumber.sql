  -- the new row takes the next rank: one more than every identity known (deleted ones included):
  -- the shadow holds all but this site's own rows inserted since the last catch-up, which are all
  -- in the table (a delete catches the shadow up first)
  UPDATE _mm_state SET applying = 1 WHERE NEW.$key IS NOT $nextkey;
  UPDATE $table SET $key = $nextkey
    WHERE $key = NEW.$key AND (SELECT applying FROM _mm_state) = 1;
  UPDATE _mm_state SET applying = 0 WHERE applying = 1;
