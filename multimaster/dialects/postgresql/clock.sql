-- multimaster: a transaction's registration and a capture's draw of the clock (PostgreSQL), as
-- plpgsql statements: Dialect.install_site splices them into site.sql (_mm_register) and
-- install_capture into every capture function (capture.sql), so the rule is written once. A
-- capture runs them inline, not as calls of _mm_register and _mm_tick: a plpgsql function's call
-- costs more than what it runs, and the two calls were 31,000 of the 300,000 instructions capture
-- added to a one-row insert, counted (docs/decisions.md, session 25). Their variables: mm_lo (the
-- bound), mm_d (a void result), mm_t (the tick).
--
-- Registration (site.sql "Positions"): once a transaction, the shared advisory lock keyed by a
-- lower bound of every tick it draws, remembered in mm.lo until the transaction ends.
IF coalesce(current_setting('mm.lo', true), '') = '' THEN
    mm_lo := greatest(pg_sequence_last_value('_mm._mm_clock'), 1125899906842624);
    mm_d := pg_advisory_xact_lock_shared(mm_lo);
    mm_d := set_config('mm.lo', mm_lo::text, true);
  END IF;
--
-- The draw: the next tick; only when it is more than $slack ticks (CLOCK_SLACK) behind the wall
-- clock does _mm_tick draw again and jump (site.sql), as it decides for itself.
mm_t := nextval('_mm._mm_clock');
  IF mm_t + $slack < $wall THEN
    mm_t := _mm._mm_tick();
  END IF;
