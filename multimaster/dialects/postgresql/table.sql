-- multimaster: per-table objects (PostgreSQL) for table $table, in the schema _mm.
-- $logcols expands to one typed n_<col> / o_<col> pair per replicated column.
-- The change log's op carries no CHECK on PostgreSQL: the constraint's text was read and prepared
-- again at every execution of the capture's INSERT, 30,000 instructions a captured row (7 % of what
-- capture adds; benchmarks/bench_pg_instructions.py). Every puller refuses an entry whose op is not
-- I, U or D and holds it in its error queue (core/errorqueue.py malformed; docs/errors.md), as it
-- does an entry whose version is none; SQLite's and MariaDB's logs keep theirs (docs/decisions.md,
-- session 23).
CREATE TABLE IF NOT EXISTS $log (
  seq bigint PRIMARY KEY,  -- the position: a tick of the clock (_mm._mm_tick), drawn after registering (site.sql)
  ver text COLLATE "C" NOT NULL UNIQUE,
  origin text NOT NULL,
  op char(1) NOT NULL,  -- no CHECK here: Dialect.install_table drops the one of earlier versions
  rid text COLLATE "C" NOT NULL,
  key $keytype,
  mask bigint NOT NULL$logcols,
  txn text,  -- (the ALTERs below and install_heads add these to a log created before them)
  sv integer,
  sup text
);
--
-- the source transaction of the entry (capture: pg_current_xact_id(); a relayed entry keeps its
-- origin's): a peer applies a transaction whole (docs/transactions.md)
ALTER TABLE $log ADD COLUMN IF NOT EXISTS txn text;
--
-- the schema version the entry was written in (store/schemas.py; NULL: 1)
ALTER TABLE $log ADD COLUMN IF NOT EXISTS sv integer;
--
-- a refresh that reads a window of a long backlog asks which transactions it saw continue past
-- the window (engine/pull.py pull_link): found by transaction, not by scanning what follows
CREATE INDEX IF NOT EXISTS $log_txn ON $log (txn);
--
-- The second-order log (docs/decisions.md "The second-order log is a view"):
-- every entry of the change log is its own append record (seq2 = seq), with the columns and types
-- the trigger-filled table of earlier versions had, so peers read it with the same SQL. Writers
-- do not commit in position order; a peer reads only below the horizon (_mm._mm_horizon), below
-- which every position is final, so no entry ever appears below a position a peer has read
-- (docs/concepts.md "Many writers"). Purges are recorded in _mm_purges.horizon.
CREATE OR REPLACE VIEW $log2 AS
  SELECT seq AS seq2, seq, 'A'::char(1) AS op FROM $log;
--
CREATE TABLE IF NOT EXISTS $shadow (
  rid text COLLATE "C" PRIMARY KEY,
  key $keytype NOT NULL$keyunique,
  deleted text COLLATE "C"$slotcols
);
--
-- (natural keys: one shadow row per incarnation of a key, found by key)
$shadowindex
--
CREATE OR REPLACE VIEW $tombstones AS
  SELECT rid, key, deleted FROM $shadow WHERE deleted IS NOT NULL;
