-- multimaster: per-site objects (SQLite). Created once per site by `multimaster init`.
CREATE TABLE IF NOT EXISTS _mm_state (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  site TEXT NOT NULL,
  applying INTEGER NOT NULL DEFAULT 0,
  hlc INTEGER NOT NULL DEFAULT 0,
  schema_version INTEGER NOT NULL DEFAULT 1,
  installed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
--
CREATE TABLE IF NOT EXISTS _mm_tables (
  tbl TEXT PRIMARY KEY,
  key_col TEXT NOT NULL,
  renumber INTEGER NOT NULL,
  columns TEXT NOT NULL,
  base_max INTEGER NOT NULL DEFAULT 0,
  caught_up INTEGER NOT NULL DEFAULT 0
);
--
CREATE TABLE IF NOT EXISTS _mm_watermarks (
  peer TEXT NOT NULL,
  tbl TEXT NOT NULL,
  seq2 INTEGER NOT NULL DEFAULT 0,
  pulled_at TEXT,
  PRIMARY KEY (peer, tbl)
);
--
CREATE TABLE IF NOT EXISTS _mm_links (
  peer TEXT PRIMARY KEY,
  last_success_at TEXT,
  last_error TEXT,
  last_error_at TEXT,
  pulled INTEGER NOT NULL DEFAULT 0,
  applied INTEGER NOT NULL DEFAULT 0,
  conflicts INTEGER NOT NULL DEFAULT 0
);
--
CREATE TABLE IF NOT EXISTS _mm_conflicts (
  id INTEGER PRIMARY KEY,
  detected_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
  tbl TEXT NOT NULL,
  rid TEXT NOT NULL,
  key TEXT,
  kind TEXT NOT NULL,
  slot TEXT,
  columns TEXT NOT NULL,
  local_ver TEXT,
  local_values TEXT,
  remote_ver TEXT NOT NULL,
  remote_values TEXT,
  policy TEXT NOT NULL,
  decision TEXT NOT NULL,
  local_row TEXT,  -- (added by store/conflicts.py install to a log created before them)
  remote_row TEXT,
  heads TEXT
);
--
-- The error queue (docs/errors.md): changes this site rejected (failed), and later changes of the
-- same row waiting behind them; skipped ones stay, with the reason.
CREATE TABLE IF NOT EXISTS _mm_errors (
  id INTEGER PRIMARY KEY,
  tbl TEXT NOT NULL,
  peer TEXT NOT NULL,
  ver TEXT NOT NULL,
  origin TEXT NOT NULL,
  rid TEXT NOT NULL,
  op TEXT NOT NULL,
  state TEXT NOT NULL,
  blocked_by INTEGER,
  error TEXT,
  first_at TEXT NOT NULL,
  last_at TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 1,
  reason TEXT,
  txn TEXT  -- always NULL here: SQLite records no source transaction (docs/errors.md)
);
--
CREATE INDEX IF NOT EXISTS _mm_errors_rid ON _mm_errors (tbl, rid);
--
-- a change is found in the queue by its version (holding one, releasing many): without this index
-- each lookup read the whole queue, and holding N changes cost N^2 (docs/performance.md)
CREATE INDEX IF NOT EXISTS _mm_errors_ver ON _mm_errors (tbl, ver);
