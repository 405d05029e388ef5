"""The error family of multimaster.

Every error names the thing that is wrong and, where there is one, the fix. The CLI maps the
family to exit codes (see docs/cli.md): ``ConfigError`` and ``SchemaError`` exit 2 (bad input,
nothing touched), everything else under ``MultimasterError`` exits 1.
"""

from __future__ import annotations

__all__ = [
    "MultimasterError",
    "ConfigError",
    "SchemaError",
    "SiteUnreachable",
    "NotInstalled",
    "BaseRowsDiffer",
    "CorruptChange",
    "UnresolvedReference",
    "ResolverError",
    "PurgedPastWatermark",
    "ChangesHeld",
    "AgentError",
    "AgentOnly",
    "NotConnected",
    "first_line",
]


def first_line(e: BaseException) -> str:
    """The first line of an error's message, its driver's own where it wraps one (a driver's
    message goes on with the statement it ran, over several lines); the error's type when it has
    no message. Not masked: callers that show it pass it through config.secrets.redact."""
    text = str(getattr(e, "orig", None) or e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class MultimasterError(Exception):
    """Base of every error multimaster raises on purpose."""

    exit_code = 1


class ConfigError(MultimasterError):
    """The topology file is wrong. Carries one message per problem."""

    exit_code = 2

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        # a command's options checked against the topology ('--id 3: no change with this id') are
        # not problems of the file
        where = (
            "with the command's options" if self.problems and all(p.startswith("-") for p in self.problems) else "in the topology"
        )
        lines = [f"{head}{len(self.problems)} problem(s) {where}:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class SchemaError(MultimasterError):
    """A replicated table is missing, differs between sites, or has an unsupported shape."""

    exit_code = 2

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(["schema check failed:"] + [f"  - {p}" for p in problems]))


class SiteUnreachable(MultimasterError):
    def __init__(self, site: str, url: str, reason: str):
        self.site = site
        super().__init__(
            f"site '{site}' ({url}) cannot be reached: {reason}. "
            "Check that the database is running and the URL in the topology file is right."
        )


class RecaptureRefused(MultimasterError):
    """multimaster recapture cannot send a table's writes without changing rows the applications
    depend on; nothing was changed (docs/schema-changes.md "A table made again")."""

    def __init__(self, site: str, table: str, reason: str):
        self.site, self.table = site, table
        super().__init__(f"recapture of table '{table}' at site '{site}' refused, nothing changed: {reason}")


class AgentError(MultimasterError):
    """A site reached through its agent (docs/agent.md) could not be read: the agent is down or
    unreachable, refused the token, serves another site, failed TLS, or broke off its answer."""

    def __init__(self, site: str, agent: str, reason: str, fix: str | None = None):
        self.site, self.agent = site, agent
        super().__init__(
            f"site '{site}' (agent {agent}): {reason}. "
            + (
                fix
                or "Check that 'multimaster serve' runs for this site there and the url and token in the topology file are right."
            )
        )


class AgentOnly(MultimasterError):
    """An operation that needs a site's database directly, asked of a site this host reaches only
    through its agent (docs/agent.md "What works through an agent")."""

    def __init__(self, site: str, agent: str, what: str = "this operation"):
        self.site, self.agent = site, agent
        super().__init__(
            f"site '{site}' is reached through its agent ({agent}), which serves reads only (its change log, schema "
            f"versions, status, clock, freshness, error queue and conflict log): {what} needs the site's database. "
            "Run it on the site's host, or with a "
            'topology file giving the site\'s database url (docs/agent.md "What works through an agent").'
        )


class NotConnected(MultimasterError):
    """A site is to pull from a source it holds no snapshot of: the link is in the topology file but
    was not installed at its target (add-site left a puller reached through its agent to be
    connected on its own host, docs/operations.md "Adding a site")."""

    def __init__(self, target: str, source: str):
        self.target, self.source = target, source
        super().__init__(
            f"site '{target}' is not connected to '{source}' yet: it holds no snapshot of its change log. On {target}'s "
            f"host run 'multimaster add-site -t FILE {source} --connect-only --site {target}'"
        )


class NotInstalled(MultimasterError):
    """A site lacks what multimaster installs. `tables`: the tables of the topology file read that
    it has no replication objects for: either they were added to the file and `init` has not run
    since, or their replication was stopped (`uninstall --table`) and the file read still lists
    them; the message gives both fixes (docs/schema-changes.md)."""

    def __init__(self, site: str, what: str = "multimaster objects", tables: list[str] | None = None):
        self.site = site
        self.tables = list(tables or [])
        if self.tables:
            super().__init__(
                f"site '{site}' has no {what}. If they are to be replicated, run 'multimaster init -t FILE' to install "
                f"them; if their replication was stopped ('multimaster uninstall --table'), remove them from tables: in "
                "the topology file this command read (a running 'multimaster run' reloads it on its own)"
            )
        else:
            super().__init__(f"site '{site}' has no {what}; run 'multimaster init -t FILE' first")


class BaseRowsDiffer(MultimasterError):
    """`init` found sites whose existing rows are not the same common base."""

    exit_code = 2

    def __init__(self, table: str, site_a: str, site_b: str, detail: str):
        super().__init__(
            f"table '{table}': sites '{site_a}' and '{site_b}' hold different rows, so they cannot "
            f"start as one cluster ({detail}). Make them equal, or empty all but one site and "
            "init copies that site's rows to the others."
        )


class BaseRowsChanged(MultimasterError):
    """`init` compared the sites' rows, and an application changed them at a site before that
    site's capture started: the change would have reached no other site. init undid what it had
    installed in that run (ops/install.py)."""

    exit_code = 2

    def __init__(self, table: str, site: str, undone: list[str]):
        where = (
            f"init undid what it had installed in this run at {', '.join(repr(n) for n in undone)}"
            if undone
            else "nothing was installed"
        )
        super().__init__(
            f"table '{table}': its rows at site '{site}' changed after init compared them with the other sites' and "
            f"before capture started there (an application wrote while init ran), so that write would have reached no "
            f"other site; {where}. Run 'multimaster init' again: it compares the rows again (and names a difference). "
            "To be sure it cannot happen, stop the applications' writes of the table until init ends, or empty all but "
            "one site (init then copies that site's rows, and writes meanwhile arrive)."
        )


class CorruptChange(MultimasterError):
    def __init__(self, table: str, peer: str, seq: object, reason: str):
        super().__init__(
            f"change log of peer '{peer}', table '{table}', entry {seq}: {reason}. Nothing from this batch was applied."
        )


class UnresolvedReference(CorruptChange):
    """A pulled change sets a reference to a renumbered table without the identity of the row it
    references (``f_<col>`` empty, the value set): the key it carries is the row's key at the
    origin when the change was written, which may name another row at this site. Never applied
    as it is: held in the error queue with this message (docs/foreign-keys.md "A reference without
    its identity")."""

    def __init__(self, site: str, table: str, column: str, parent: str, peer: str, ver: str, origin: str, op: str, value: object):
        what = "insert" if op == "I" else "update"
        again = (
            f"write the row again at '{origin}' (delete it and insert it, its {column} set), so that every site gets it with "
            "the identity"
            if op == "I"
            else f"set {table}.{column} of the row again at '{origin}' (to NULL and back, or to the row it should name): "
            "that update carries the identity"
        )
        MultimasterError.__init__(
            self,
            f"site '{site}', table '{table}', column '{column}': the {what} {ver} (origin '{origin}', pulled from '{peer}') "
            f"sets {column} = {value!r} without the identity of the '{parent}' row it references (f_{column} is empty). "
            f"That key is the row's key at '{origin}' when the change was written and may name another '{parent}' row here, "
            f"so the change is held, not applied. Fix: {again}; then drop this one here: 'multimaster errors skip -t FILE "
            f'--site {site} --id ID --reason TEXT\' (docs/foreign-keys.md "A reference without its identity")',
        )


class EntryTooLarge(MultimasterError):
    """A pulled change larger than the receiving MariaDB's max_allowed_packet: no statement can
    carry it there (the server drops the connection, "server has gone away")."""

    def __init__(self, site: str, table: str, peer: str, key: object, size: int, limit: int):
        need = 1 << max(size + 65_536, 1).bit_length()
        super().__init__(
            f"site '{site}': a change of table '{table}' (key {key!r}, pulled from '{peer}') is {size:,} bytes, larger than "
            f"its max_allowed_packet ({limit:,} bytes) lets a statement carry. Nothing from this batch was applied. Fix: "
            f"at '{site}' run 'SET GLOBAL max_allowed_packet = {need}' (and set it in the server's configuration), then "
            "refresh again (a running daemon: restart it, its open connections keep the old limit); docs/types.md "
            '"Values a site cannot store"'
        )


class ClockAhead(MultimasterError):
    """A pulled change's version is further ahead of this site's wall clock than the topology's
    refresh.max_clock_offset: the batch is held (nothing applied, the watermark stays)."""

    def __init__(self, source: str, target: str, table: str, seq: object, origin: str, ahead: float, limit: float):
        super().__init__(
            f"site '{target}' holds the changes of table '{table}' from peer '{source}': entry {seq} (origin "
            f"'{origin}') has a version {ahead:.1f} s ahead of this site's clock, past refresh.max_clock_offset "
            f"({limit:g} s). Nothing from this batch was applied, and this site's clock was not moved. Correct the "
            f"clock of site '{origin}' (its changes flow again once their versions are within the offset), or raise "
            "refresh.max_clock_offset in the topology file."
        )


class ResolverError(MultimasterError):
    def __init__(self, path: str, reason: str):
        super().__init__(f"conflict resolver '{path}': {reason}")


class PurgedPastWatermark(MultimasterError):
    """A puller's watermark is below what its peer already purged: it missed changes."""

    def __init__(self, source: str, target: str, table: str, watermark: int, horizon: int):
        self.source, self.target, self.table = source, target, table
        super().__init__(
            f"site '{source}' purged changes of table '{table}' that site '{target}' had not pulled "
            f"(watermark {watermark}, purged up to {horizon}): '{target}' stayed away longer than the retention. "
            f"Re-instantiate it: multimaster remove-site -t FILE {target} --force, then "
            f"multimaster add-site -t FILE {target} --from {source} --replace"
        )


class ChangesHeld(MultimasterError):
    """A site holds changes in its error queue (docs/errors.md) and an operation would copy its
    state without them."""

    def __init__(self, site: str, count: int, operation: str):
        self.site = site
        super().__init__(
            f"site '{site}' holds {count} change(s) in its error queue, and {operation} would copy its rows without "
            f"them. Apply or drop them first: multimaster errors -t FILE --site {site}, then 'errors retry' or 'errors skip'."
        )
