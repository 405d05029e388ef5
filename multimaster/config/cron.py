"""Cron expressions: the one parser that both checks the topology file and schedules the daemon,
so a schedule the file accepts is exactly the schedule that runs. APScheduler's CronTrigger is
imported inside the function: loading a topology without a cron field needs no scheduler."""

from __future__ import annotations

from typing import Any

__all__ = ["cron_trigger"]


def cron_trigger(expr: str, jitter: float | None = None) -> Any:
    """A crontab expression (5 fields; 6 fields: seconds first) as an APScheduler trigger."""
    from apscheduler.triggers.cron import CronTrigger

    fields = expr.split()
    if len(fields) == 5:
        trig = CronTrigger.from_crontab(expr)
    elif len(fields) == 6:
        sec, minute, hour, day, month, dow = fields
        trig = CronTrigger(second=sec, minute=minute, hour=hour, day=day, month=month, day_of_week=dow)
    else:
        raise ValueError(f"cron expression '{expr}' needs 5 fields (minute hour day month weekday) or 6 (seconds first)")
    trig.jitter = jitter or None
    return trig
