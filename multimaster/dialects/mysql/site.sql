-- multimaster: per-site objects (MariaDB 10.6+ / MySQL 8.0.13+, for the expression defaults).
-- Created once per site by `multimaster init`; every name starts with _mm_ (`multimaster
-- uninstall` drops them). Every table has a primary key (MySQL's sql_require_primary_key).
-- Versions and identities compare as bytes (utf8mb4_bin), the order the engine sorts them in.
CREATE TABLE IF NOT EXISTS _mm_state (
  id INT PRIMARY KEY CHECK (id = 1),
  site VARCHAR(64) NOT NULL,
  applying INT NOT NULL DEFAULT 0,
  hlc BIGINT NOT NULL DEFAULT 0,
  schema_version INT NOT NULL DEFAULT 1,
  installed_at VARCHAR(32) NOT NULL DEFAULT (DATE_FORMAT(UTC_TIMESTAMP(3), '%Y-%m-%dT%H:%i:%s.%fZ'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
CREATE TABLE IF NOT EXISTS _mm_tables (
  tbl VARCHAR(64) PRIMARY KEY,
  key_col VARCHAR(64) NOT NULL,
  renumber INT NOT NULL,
  columns TEXT NOT NULL,
  base_max BIGINT NOT NULL DEFAULT 0,
  keys_ranked BIGINT NOT NULL DEFAULT 0  -- all keys up to it are base_max + rank (engine/apply.py normalize_keys)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
ALTER TABLE _mm_tables ADD COLUMN IF NOT EXISTS keys_ranked BIGINT NOT NULL DEFAULT 0;
--
-- One row per replicated table: the reconcilers' lock (Dialect.lock_for_apply locks it FOR
-- UPDATE, so the reconcilers of a table run one at a time and a relay hands an origin's changes on
-- in version order). Application writers never touch it. (hlc and maxkey are what earlier
-- versions' capture kept here; nothing reads them any more.)
CREATE TABLE IF NOT EXISTS _mm_clock (
  tbl VARCHAR(64) PRIMARY KEY,
  hlc BIGINT NOT NULL DEFAULT 0,
  maxkey BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
CREATE TABLE IF NOT EXISTS _mm_watermarks (
  peer VARCHAR(64) NOT NULL,
  tbl VARCHAR(64) NOT NULL,
  seq2 BIGINT NOT NULL DEFAULT 0,
  pulled_at VARCHAR(32),
  PRIMARY KEY (peer, tbl)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
CREATE TABLE IF NOT EXISTS _mm_links (
  peer VARCHAR(64) PRIMARY KEY,
  last_success_at VARCHAR(32),
  last_error TEXT,
  last_error_at VARCHAR(32),
  pulled BIGINT NOT NULL DEFAULT 0,
  applied BIGINT NOT NULL DEFAULT 0,
  conflicts BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
CREATE TABLE IF NOT EXISTS _mm_conflicts (
  id BIGINT AUTO_INCREMENT PRIMARY KEY,
  detected_at VARCHAR(32) NOT NULL DEFAULT (DATE_FORMAT(UTC_TIMESTAMP(3), '%Y-%m-%dT%H:%i:%s.%fZ')),
  tbl VARCHAR(64) NOT NULL,
  rid VARCHAR(255) NOT NULL,
  `key` TEXT,
  kind VARCHAR(32) NOT NULL,
  slot VARCHAR(64),
  columns TEXT NOT NULL,
  local_ver VARCHAR(255),
  local_values LONGTEXT,
  remote_ver VARCHAR(255) NOT NULL,
  remote_values LONGTEXT,
  policy VARCHAR(255) NOT NULL,
  decision VARCHAR(32) NOT NULL,
  local_row LONGTEXT,  -- (added by store/conflicts.py install to a log created before them)
  remote_row LONGTEXT,
  heads LONGTEXT
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
-- The error queue (docs/errors.md): changes this site rejected (failed), and later changes of the
-- same row waiting behind them; skipped ones stay, with the reason.
CREATE TABLE IF NOT EXISTS _mm_errors (
  id BIGINT AUTO_INCREMENT PRIMARY KEY,
  tbl VARCHAR(64) NOT NULL,
  peer VARCHAR(64) NOT NULL,
  ver VARCHAR(255) NOT NULL,
  origin VARCHAR(64) NOT NULL,
  rid VARCHAR(255) NOT NULL,
  op VARCHAR(8) NOT NULL,
  state VARCHAR(16) NOT NULL,
  blocked_by BIGINT,
  error TEXT,
  first_at VARCHAR(32) NOT NULL,
  last_at VARCHAR(32) NOT NULL,
  attempts INT NOT NULL DEFAULT 1,
  reason TEXT,
  txn VARCHAR(64),  -- the change's source transaction: held with it (docs/errors.md)
  INDEX _mm_errors_rid (tbl, rid)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
ALTER TABLE _mm_errors ADD COLUMN IF NOT EXISTS txn VARCHAR(64);  -- a site installed before it
--
-- a change is found in the queue by its version (holding one, releasing many): without this index
-- each lookup read the whole queue, and holding N changes cost N^2 (docs/performance.md)
CREATE INDEX IF NOT EXISTS _mm_errors_ver ON _mm_errors (tbl, ver);
--
-- The clock (docs/mysql.md "How capture works with many writers"). A change-log entry's position
-- is a value of this table's AUTO_INCREMENT, drawn by the transaction that writes the entry
-- (INSERT ... VALUES (NULL), LAST_INSERT_ID()), and a change captured here has that value as its
-- version (LPAD(p, 19, '0'):site): writers never wait for each other (InnoDB hands AUTO_INCREMENT
-- values of simple inserts out under a mutex, in increasing order; no row of the table is ever
-- read by a writer). It follows the wall clock (ms * 65536): a draw that finds the counter more
-- than one millisecond behind it inserts an explicit value of the current millisecond, which moves
-- the counter (_mm_draw);
-- the reconciler moves it past every version received the same way. (A SEQUENCE cannot: SETVAL
-- takes only a literal, and no trigger can run dynamic SQL.) A draw's explicit value is its
-- position when it went in (_mm_draw); the reconciler's explicit values are never positions.
-- The table is system-versioned, transaction-precise: each row's trx (ROW START) is the InnoDB id
-- of the transaction that drew it, which is how a reader learns a captured entry's transaction
-- (_mm_stamp below; docs/transactions.md "MariaDB's transaction id"). MariaDB records each such transaction in
-- mysql.transaction_registry at COMMIT, a table no DELETE may touch: purge truncates it where that
-- is allowed and safe (Dialect.trim_registry, docs/mysql.md "The transaction registry"); the
-- clock's own history goes at the stamping's trim (_mm_stamp below). (Dialect.install_site adds
-- the versioning to the table of a site installed before it.)
CREATE TABLE IF NOT EXISTS _mm_tick (
  t BIGINT AUTO_INCREMENT PRIMARY KEY,
  trx BIGINT UNSIGNED GENERATED ALWAYS AS ROW START INVISIBLE,
  trx_end BIGINT UNSIGNED GENERATED ALWAYS AS ROW END INVISIBLE,
  PERIOD FOR SYSTEM_TIME(trx, trx_end)
) ENGINE=InnoDB WITH SYSTEM VERSIONING;
--
-- One draw: the next value of the clock, at most one millisecond behind the wall clock. The counter
-- is drawn first; only when the value is more than 1 ms (CLOCK_SLACK, dialects/base.py) behind the
-- wall clock (w, in units of 1/65536 ms, read in whole milliseconds) does an explicit value v move
-- the counter into w's millisecond (as PostgreSQL's clock jumps, site.sql there; docs/clock.md
-- "Rules"): a site drawing several times a millisecond catches up at most once every two
-- milliseconds, not at every millisecond's first draw (with no slack, every draw of one
-- connection and 87 % of 16 clients' caught up, 34,000 instructions each; docs/decisions.md,
-- session 24). v is the position when its INSERT inserted it (the first
-- value then is not a position); when v was there already (the duplicate key error 1062, handled
-- for that one INSERT: ROW_COUNT() reads 0 inside a trigger), the draw is repeated. v serves
-- as well as a drawn value: it exceeds the value drawn first in this call (v > w > p), which was
-- drawn with the slot locked, so the horizon's proof holds for it as for p (_mm_horizon below);
-- and every later value of the counter exceeds it (InnoDB moves the counter past an explicit value
-- inserted above it), so the connection's positions rise and a draw that follows this
-- transaction's COMMIT sorts after it. No value the horizon lies above is ever inserted again, and
-- only the trim below the horizon deletes rows (_sync_clock keeps its own): a position is the one
-- row of the clock, current or history, at its value (_mm_stamp reads it). One explicit insert
-- instead of an explicit insert and a second draw: 16,000-19,000 instructions less per captured
-- statement, counted with every draw catching up, as under callgrind every draw does (docs/decisions.md,
-- session 23).
-- The explicit value is w + 32768 + a hash of the connection id, not w itself: an INSERT
-- that meets a value inserted by a transaction still open waits for that transaction to end, so
-- two writers whose draws fell in one millisecond, both inserting w, made the second wait for the
-- first's COMMIT (tests/test_server_many_writers.py). Distinct connections insert distinct values;
-- and a value already passed by the counter is found there without a wait unless a transaction
-- still open drew exactly it in the microseconds between the two inserts (docs/mysql.md, Limits).
-- Called by the capture triggers inside the UPDATE that locks their slot (capture.sql), so the
-- slot is locked first. It does not read its row's transaction id back: _mm_stamp adds it to the
-- entries later, for the readers (that read cost 25-50 us a captured row; docs/decisions.md). @mm_trx
-- stays empty for triggers installed before (their txn then ends in '.' as the new ones' does).
-- LAST_INSERT_ID() is restored when the function returns: an application's own insert id is kept.
CREATE OR REPLACE FUNCTION _mm_draw() RETURNS BIGINT NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY DEFINER
BEGIN
  DECLARE p BIGINT;
  DECLARE w BIGINT DEFAULT CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) * 65536;
  INSERT INTO _mm_tick (t) VALUES (NULL);
  SET p = LAST_INSERT_ID();
  IF p + $slack < w THEN
    SET p = w + 32768 + MOD(CONNECTION_ID() * 40503, 32768);
    BEGIN
      DECLARE CONTINUE HANDLER FOR 1062 SET p = NULL;
      INSERT INTO _mm_tick (t) VALUES (p);
    END;
    IF p IS NULL THEN
      INSERT INTO _mm_tick (t) VALUES (NULL);
      SET p = LAST_INSERT_ID();
    END IF;
  END IF;
  SET @mm_trx = '';
  RETURN p;
END
--
-- The drawing transaction's id, as capture triggers installed before this change (2026-11-27) ask for it (they
-- named a transaction by the session's Com_commit + Com_begin, read from
-- information_schema.SESSION_STATUS once per statement at ~100 us; init re-creates them reading
-- @mm_trx directly, capture.sql, and would otherwise leave them failing between its steps).
CREATE OR REPLACE FUNCTION _mm_txno() RETURNS VARCHAR(40) NOT DETERMINISTIC NO SQL SQL SECURITY DEFINER
  RETURN @mm_trx;
--
-- Slots: one row per (replicated table, connection) that captured changes of that table. Every
-- captured row locks its connection's slot and draws its position into the slot's cur in one
-- UPDATE (for a connection's first capture an INSERT first, see capture.sql): the slot is X-locked
-- from the transaction's first draw until COMMIT / ROLLBACK, and its *committed* cur is the last
-- position of the connection's previous transaction, below every position the running one draws.
-- lo is a value drawn when the slot was created, the bound of a connection whose slot is not
-- committed yet. epoch: of earlier releases (_mm_conns below), no longer read or written.
CREATE TABLE IF NOT EXISTS _mm_slots (
  tbl VARCHAR(64) NOT NULL,
  conn BIGINT UNSIGNED NOT NULL,
  lo BIGINT NOT NULL,
  cur BIGINT NOT NULL,
  epoch BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (tbl, conn)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
-- Epochs, of earlier releases (docs/transactions.md): a capturing transaction recorded as each
-- entry's txn its connection and an epoch, which a horizon renewed for connections between
-- transactions, and a new slot read from this table. Since the reader stamps every entry with its
-- InnoDB transaction id (_mm_stamp), the epoch told nothing more: capture writes epoch 0 and
-- names neither this table nor the slots' epoch (each table a trigger names costs every statement
-- that fires it, 7,000-10,000 instructions), and _mm_stamp rewrites an entry's epoch to 0. The
-- table stays for the capture triggers of the release before, until init has replaced them.
CREATE TABLE IF NOT EXISTS _mm_conns (
  conn BIGINT UNSIGNED PRIMARY KEY,
  epoch BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
ALTER TABLE _mm_slots ADD COLUMN IF NOT EXISTS epoch BIGINT NOT NULL DEFAULT 0;
--
-- Transaction bounds (docs/transactions.md "Bounds"): each horizon records, per connection, the
-- highest committed cur of its slots, read at READ COMMITTED without a lock: the last position of
-- the connection's latest committed capturing transaction; its later transactions draw only past
-- it. So every recorded bound is a boundary between two of the connection's transactions, and a
-- reader splits a txn (connection:epoch) at every bound: an epoch changed only while the
-- connection was between transactions, which a connection under a steady load never is when a
-- horizon looks, and one txn then ran on without end, always past the horizon, and no batch could
-- end. (Since the stamped transaction id, a second line no measured case needs.) Trimmed by
-- purge below the lowest position the change logs still hold.
CREATE TABLE IF NOT EXISTS _mm_bounds (
  conn BIGINT UNSIGNED NOT NULL,
  upto BIGINT NOT NULL,
  PRIMARY KEY (conn, upto),
  KEY (upto)
) ENGINE=InnoDB;
--
-- The gate of a table's slots: a local insert into a renumbered table whose connection's slot
-- did not pass it yet locks the table's row here in SHARE MODE before it draws (in a table of its
-- own: a trigger that also writes _mm_slots would turn a shared read of _mm_slots into an
-- exclusive one). The reconciler, when it gives keys, locks the gate and every slot of the table
-- (Dialect.lock_writers): then no local insert is in flight and none can start. Updates and
-- deletes, which hold their row's lock when their trigger runs, never wait at the gate.
CREATE TABLE IF NOT EXISTS _mm_gates (
  tbl VARCHAR(64) PRIMARY KEY
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
-- Stamps: a captured entry's txn is written as '<connection>:0.' (capture.sql), and a reader
-- completes it with the id of the transaction that drew its position, the ROW START of the clock's
-- row at t = seq (_mm_stamp), before it reads the entries. upto: every entry of the table's change
-- log (log) below it is stamped or was rolled back. The clock's rows stay (as rows or as history)
-- until every replicated table's upto has passed them (_mm_stamp's trim).
CREATE TABLE IF NOT EXISTS _mm_stamps (
  tbl VARCHAR(64) PRIMARY KEY,
  log VARCHAR(192) NOT NULL,
  upto BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
-- Stamp the entries of tname's change log from its upto on: each committed one whose txn ends in
-- '.' gets the ROW START of its clock row, and upto moves to hz, tname's horizon read before.
-- A reader calls it for every table it reads after it has read the horizons of all of them
-- (Dialect.read_horizons): an entry below a horizon belongs to a transaction that had ended when
-- that horizon was read, so every entry of that transaction, in any table, past a horizon or not,
-- is committed and stamped here. An entry of a transaction still open is skipped without a wait
-- (READ COMMITTED: a single-table UPDATE passes over a row whose insert is not committed) and is
-- stamped by a later call (it lies at or past hz, from where the next call starts again). A
-- transaction that commits while this runs may be stamped in part; it is open at every horizon
-- read before, so all its entries lie at or past them and no batch takes any of it
-- (core/batches.py "Held back whole"); the next call stamps the rest. The log's name is the one
-- install_capture recorded, never the caller's. SQL SECURITY DEFINER: pull roles need EXECUTE.
CREATE OR REPLACE PROCEDURE _mm_stamp(IN tname VARCHAR(64), IN hz BIGINT)
  MODIFIES SQL DATA SQL SECURITY DEFINER
BEGIN
  DECLARE s, top BIGINT;
  DECLARE lg VARCHAR(192);
  DECLARE iso VARCHAR(32) DEFAULT @@session.tx_isolation;
  COMMIT;
  SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;
  SELECT upto, log INTO s, lg FROM _mm_stamps WHERE tbl = tname FOR UPDATE;
  IF lg IS NOT NULL THEN
    -- this site's own entries only (a relayed one keeps its origin's txn)
    -- '<connection>:0.<id>': an epoch other than 0 (written by the capture triggers of the release
    -- before, in init's moments between replacing them; or stamped by the _mm_stamp before, which
    -- can have stamped a transaction committing during its run in part) becomes 0, so all entries
    -- of one transaction get one name, whichever release wrote or stamped them
    SET @mm_stamp_sql = CONCAT('UPDATE ', lg, ' SET txn = CONCAT(SUBSTRING_INDEX(txn, '':'', 1), '':0.'', ',
      'IF(txn LIKE ''%.'', (SELECT k.trx FROM _mm_tick FOR SYSTEM_TIME ALL k WHERE k.t = seq), SUBSTRING_INDEX(txn, ''.'', -1))) ',
      'WHERE seq >= ', s, ' AND (txn LIKE ''%.'' OR txn NOT LIKE ''%:0.%'') AND origin = (SELECT site FROM _mm_state WHERE id = 1)');
    PREPARE mm_stamp FROM @mm_stamp_sql;
    EXECUTE mm_stamp;
    DEALLOCATE PREPARE mm_stamp;
    UPDATE _mm_stamps SET upto = hz WHERE tbl = tname AND upto < hz;
  END IF;
  COMMIT;
  SET SESSION tx_isolation = iso;
  -- at most once a second per reading session: the clock's rows below every replicated table's
  -- upto (their entries are stamped; hz <= its table's horizon, below which transactions ended) go,
  -- the newest row stays (read_clock); a row still locked (an explicit value the reconciler
  -- inserted, its transaction still open) makes the trim give up at once. The table is
  -- system-versioned: what the previous trims deleted is its history, which goes first (DELETE HISTORY records
  -- nothing in mysql.transaction_registry; purge truncates that: Dialect.trim_registry).
  -- The session's lock wait timeout is set back however the trim ends: left at 0, every later
  -- lock wait of the session (a pooled connection the engine uses again) failed at once.
  IF hz - coalesce(@mm_trimmed, 0) > 65536000 THEN
    SET @mm_lwt = @@session.innodb_lock_wait_timeout;
    BEGIN
      DECLARE EXIT HANDLER FOR 1205, 1213
        BEGIN
          ROLLBACK;
          SET SESSION innodb_lock_wait_timeout = @mm_lwt;
          SET @mm_trimmed = hz;
        END;
      DECLARE EXIT HANDLER FOR SQLEXCEPTION
        BEGIN
          ROLLBACK;
          SET SESSION innodb_lock_wait_timeout = @mm_lwt;
          RESIGNAL;
        END;
      SELECT LEAST(max(t), (SELECT coalesce(min(coalesce(s.upto, 0)), max(t)) FROM _mm_tables r LEFT JOIN _mm_stamps s ON s.tbl = r.tbl))
        INTO top FROM _mm_tick;
      SET SESSION innodb_lock_wait_timeout = 0;
      DELETE HISTORY FROM _mm_tick;
      DELETE FROM _mm_tick WHERE t < LEAST(hz, coalesce(top, 0)) ORDER BY t LIMIT 100000;
      COMMIT;
      SET SESSION innodb_lock_wait_timeout = @mm_lwt;
      SET @mm_trimmed = hz;
    END;
  END IF;
END
--
-- The horizon of table tname: every position below it is final (its transaction committed, and a
-- statement started after this call sees it, or rolled back). Returns it as a one-row result.
-- (a) c0 := a value drawn from _mm_tick (the insert rolled back: the value is never reused);
-- (b) the free slots of tname: those a locking read does not find locked
-- (LOCK IN SHARE MODE SKIP LOCKED); (c) per other slot its committed cur (READ COMMITTED), or its lo
-- when no committed version exists (READ UNCOMMITTED), plus one (every position a running
-- transaction draws is above it); H = least(c0, min of (c)). Why: a
-- position p < H was drawn by a call of _mm_draw that began before (a) (one that began after
-- returns more than c0: its first value does, and an explicit value it keeps exceeds that), in a
-- transaction W that locked its slot before the call.
-- Had W still run at (b), its slot would have been locked, and (c) would have read a value below
-- p: the committed cur of W's slot predates W (only W's connection writes it), a slot W created
-- carries a lo drawn before p; so H <= p, impossible. W ended before (b), and its commit is
-- visible to the next statement of the caller. Each step runs in a transaction of its own (the
-- caller's ends first): the reader holds a slot only for the instant of (b).
-- SQL SECURITY DEFINER: pull roles need only EXECUTE on it.
CREATE OR REPLACE PROCEDURE _mm_horizon(IN tname VARCHAR(64))
  MODIFIES SQL DATA SQL SECURITY DEFINER
BEGIN
  DECLARE c0, g, hz BIGINT;
  DECLARE free, seen LONGTEXT;
  DECLARE iso VARCHAR(32) DEFAULT @@session.tx_isolation;
  COMMIT;
  -- (0) the transaction bounds of every connection, before c0 (docs/transactions.md "Bounds"); a
  -- concurrent horizon recording the same bound (a lock wait, a deadlock) only skips it this time
  SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;
  BEGIN
    DECLARE CONTINUE HANDLER FOR 1205, 1213 ROLLBACK;
    INSERT IGNORE INTO _mm_bounds (conn, upto) SELECT conn, max(cur) FROM _mm_slots WHERE cur > 0 GROUP BY conn;
    COMMIT;
  END;
  SET SESSION tx_isolation = iso;
  INSERT INTO _mm_tick (t) VALUES (NULL);
  SET c0 = LAST_INSERT_ID();
  ROLLBACK;
  SELECT GROUP_CONCAT(conn) INTO free FROM _mm_slots WHERE tbl = tname LOCK IN SHARE MODE SKIP LOCKED;
  COMMIT;
  SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;
  SELECT JSON_OBJECTAGG(conn, cur) INTO seen FROM _mm_slots
   WHERE tbl = tname AND NOT FIND_IN_SET(conn, coalesce(free, ''));
  COMMIT;
  SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED;
  SELECT min(coalesce(CAST(JSON_VALUE(seen, CONCAT(CHAR(36), '."', conn, '"')) AS SIGNED), lo) + 1) INTO g FROM _mm_slots
   WHERE tbl = tname AND NOT FIND_IN_SET(conn, coalesce(free, ''));
  COMMIT;
  -- the caller's level again: a session left READ UNCOMMITTED read what other transactions had
  -- not committed (a puller's watermark its refresh was still moving let a purge take entries
  -- that puller never got, when its refresh rolled back; tests/test_purge.py)
  SET SESSION tx_isolation = iso;
  SET hz = LEAST(c0, coalesce(g, c0));
  SELECT hz AS h;
END
