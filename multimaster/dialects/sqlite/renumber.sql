  -- the new row takes the next rank, one more than every identity known (deleted ones included),
  -- which its change log entry recorded: move it there when the database gave it another key
  UPDATE $table SET $key = $lastinsertkey
    WHERE $key = NEW.$key AND NEW.$key IS NOT $lastinsertkey;
