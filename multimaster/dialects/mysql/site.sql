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
  base_max BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
--
-- Per replicated table: the clock and the highest key given. Every captured write locks its
-- table's row until COMMIT (so does the reconciler): versions, ranks and change-log sequence
-- numbers (the second-order log's seq2) are then given in commit order. The row also carries the
-- floor (the highest version received: the reconciler and add-site raise it), the only clock
-- state the capture triggers read. See docs/mysql.md.
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
  decision VARCHAR(32) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
