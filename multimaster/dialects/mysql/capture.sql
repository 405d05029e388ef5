-- multimaster: capture triggers (MariaDB) on $table. The echo guard skips changes the reconciler
-- applies: it sets the session variable @mm_applying = 1, which no other session sees.
-- Writers of the table never wait for each other (docs/mysql.md "How capture works with many
-- writers"): every captured row draws its position through its connection's slot ($draw: lock the
-- slot, then draw p from the clock _mm_tick; site.sql), writes its change-log entry at seq = p,
-- and its version is p formatted (LPAD(p, 19, '0'):site). Updates and deletes draw in their AFTER
-- trigger, after the row lock: a change that overwrote another's committed write has a later
-- version. On a renumbered table the key trigger (renumber.sql) drew the position for the inserted
-- row already, before its key: the insert trigger takes it from the table's own session variable
-- $posvar ($insdraw), which the key trigger set for this very row (it fires for every row, just
-- before; MariaDB lets no statement of the row's triggers insert into the same table, and a user
-- trigger that writes another replicated table in between sets that table's variable), and clears
-- it. So the insert trigger of a renumbered table names no slot: every table a trigger names costs
-- every statement that fires it, whichever branch runs (10,600 instructions an insert, counted;
-- docs/decisions.md, session 23). On a natural-key table $insdraw is $draw. (`@v := expr` inside an
-- expression is deprecated in MySQL 8.0.13+ but still supported; docs/mysql.md.)
-- Each entry records its source transaction: txn = the connection and the epoch 0 (the epochs of
-- earlier releases, docs/transactions.md), then '.'; a reader appends the InnoDB
-- id of the transaction, the ROW START of the clock row the draw inserted, before it reads the
-- entry (site.sql _mm_stamp, docs/transactions.md): reading it back here cost 25-50 us a row.
-- A natural-key table's shadow holds one row per incarnation of a key: $live restricts updates and
-- deletes to the live one (deleted IS NULL); mm_r is a new row's incarnation ($ridinit). A key's
-- first incarnation goes into the shadow without reading it first (a read inside a trigger is a
-- locking read, and under REPEATABLE READ its gap lock would make concurrent inserts of
-- neighbouring keys wait for each other): only when that row exists already is the shadow read.
-- On a table with a slot whose policy chooses among concurrent heads (docs/conflicts.md
-- "Concurrent heads"), an update records in sup the heads it supersedes, for each such slot it
-- sets: the version the shadow holds ('=' for the row's default) and the slot's other heads
-- (h_<slot>); it then clears them ($supcol / $supval, $slotstamp). Elsewhere both are empty.
-- Updates and deletes read the row's rid in the UPDATE that stamps its shadow row, `rid = (@mm_rid :=
-- rid)`, before the entry goes in: one access to the shadow instead of a read and an UPDATE (every
-- table a statement touches costs 30-40 us on MariaDB; 16 clients updating: 0.61 -> 0.63 of plain).
-- The heads are read first ($supread), before that UPDATE clears them.
-- A row with no live identity in the shadow (inserted while the table's capture was missing, and
-- not captured yet: the moment between a follow's triggers made again, which DDL commits at once,
-- and its capture of those rows; or a row whose capture was refused, the gap says so) is updated
-- or deleted without an entry: the follow, run again at once until it ends (the table stays marked
-- as being made again, store/schemas.py mark_capturing), or recapture while the gap is open, sends
-- the row whole as it is then, and a deleted one was never sent. (Before, the entry's rid was
-- NULL and the application's statement failed: `Column 'rid' cannot be null`. Session 36.)
-- The update trigger also refuses an application's change of the key (the framework's): MariaDB
-- has no BEFORE UPDATE OF <column> trigger, so a guard of its own fired for every updated row
-- (13,500 instructions an application's one-row update, 27,600 each row the reconciler updates;
-- counted, benchmarks/bench_mysql_instructions.py). Refused after the row changed, the statement is undone
-- all the same; a key changed into one that exists fails as a duplicate key first.
DROP TRIGGER IF EXISTS $cap_i;
--
CREATE TRIGGER $cap_i AFTER INSERT ON $table FOR EACH ROW
BEGIN
  DECLARE mm_v VARCHAR(255);$ridvar
  IF coalesce(@mm_applying, 0) = 0 THEN
    $insdraw
    SET mm_v = CONCAT(LPAD(@mm_p, 19, '0'), ':', $site_lit);$ridinit
    INSERT INTO $log (seq, ver, origin, op, rid, `key`, mask, txn, sv$ncols)
      VALUES (@mm_p, mm_v, $site_lit, 'I', $insrid, NEW.$key, $allmask, CONCAT(CONNECTION_ID(), ':0.'), $sv$newvals);$shadowins
  END IF;
END;
--
DROP TRIGGER IF EXISTS $cap_u;
--
CREATE TRIGGER $cap_u AFTER UPDATE ON $table FOR EACH ROW
BEGIN
  DECLARE mm_v VARCHAR(255);
  IF coalesce(@mm_applying, 0) = 0 THEN
    IF NOT (OLD.$key <=> NEW.$key) THEN
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = $keyguard_msg;
    END IF;
    IF $anychanged THEN
      $draw
      SET mm_v = CONCAT(LPAD(@mm_p, 19, '0'), ':', $site_lit), @mm_rid = NULL;$supread
      UPDATE $shadow SET rid = (@mm_rid := rid)$slotstamp WHERE `key` = NEW.$key$live;
      IF @mm_rid IS NOT NULL THEN
        INSERT INTO $log (seq, ver, origin, op, rid, `key`, mask, txn, sv$ncols$ocols$supcol)
          VALUES (@mm_p, mm_v, $site_lit, 'U', @mm_rid, NEW.$key, $updmask, CONCAT(CONNECTION_ID(), ':0.'), $sv$updnew$updold$supval);
      END IF;
    END IF;
  END IF;
END;
--
DROP TRIGGER IF EXISTS $cap_d;
--
CREATE TRIGGER $cap_d AFTER DELETE ON $table FOR EACH ROW
BEGIN
  DECLARE mm_v VARCHAR(255);
  IF coalesce(@mm_applying, 0) = 0 THEN
    $draw
    SET mm_v = CONCAT(LPAD(@mm_p, 19, '0'), ':', $site_lit), @mm_rid = NULL;
    UPDATE $shadow SET rid = (@mm_rid := rid), deleted = mm_v WHERE `key` = OLD.$key$live;
    IF @mm_rid IS NOT NULL THEN
      INSERT INTO $log (seq, ver, origin, op, rid, `key`, mask, txn, sv$ocols)
        VALUES (@mm_p, mm_v, $site_lit, 'D', @mm_rid, OLD.$key, $allmask, CONCAT(CONNECTION_ID(), ':0.'), $sv$oldvals);
    END IF;
  END IF;
END;
--
-- The key guard of earlier releases, a BEFORE UPDATE trigger of its own: the update trigger refuses
-- key changes now (MariaDB has no UPDATE OF <column> trigger, and a BEFORE UPDATE trigger cost
-- each updated row 27,600 instructions, the reconciler's rows too).
DROP TRIGGER IF EXISTS $keyguard;
