"""Errors of the changelog layer. Each carries the data needed to act on it.

Also the one redaction of credentials (`redact`, `redact_url`) that every error text naming a URL or a
connection string passes through before it is stored or printed, in this layer and the ones above it (this is the
lowest layer, so each can use it): a message never shows a password, whatever its source put in it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = [
    "redact",
    "redact_url",
    "url_password",
    "ChangelogError",
    "InvalidRecord",
    "RecordTooLarge",
    "NotStored",
    "IngestFailed",
    "UnknownTopic",
    "ReadFrom",
    "ViewNotPublished",
    "TopicChanged",
    "KafkaUnavailable",
    "NotProduced",
    "line_ranges",
    "PostgresUnavailable",
    "PostgresMisconfigured",
    "PgDsnInvalid",
    "PostgresAuthFailed",
    "CdcFailed",
]

# A URL's userinfo: up to the last "@" (a password may hold "?", "#", "/" or "@").
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<userinfo>.*)@(?P<rest>[^@]*)$", re.S)
_SCHEME = re.compile(r"^\s*[A-Za-z][A-Za-z0-9+.-]*://")
# A password as a URL's query option (`?password=`, libpq's `?sslpassword=` too).
_QUERY_SECRET = re.compile(r"([?&](?:password|pass|pwd|sslpassword)=)[^&#\s\"']*", re.I)
# A password as a libpq keyword (`password=x`, `password = 'a b'`, `sslpassword=x`), anywhere in a text.
_KEYWORD_SECRET = re.compile(r"(\b(?:ssl)?password\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|[^\s'\"]+)", re.I)
_KEYWORD_VALUE = re.compile(r"\b(?:ssl)?password\s*=\s*(?:'((?:[^'\\]|\\.)*)'?|([^\s'\"]+))", re.I)
# `scheme://user:password@` in a text, up to the last "@" of the word; the placeholder `:PASSWORD@` stays.
_IN_TEXT = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@\"'<>]*):[^\s\"'<>]*@")


def redact_url(url) -> str:
    """`url` with its password replaced by `***` (user, host, port, db and options kept); a `password=` query
    option is masked too. Never raises: whatever the text, what looks like a password is not returned."""
    text = str(url)
    m = _USERINFO.match(text)
    if m is not None:
        user, sep, _password = m["userinfo"].partition(":")
        rest = text[m.end("userinfo") + 1 :]
        text = f"{m['scheme'] or ''}{user}{':***' if sep else ''}@{rest}"
    return _QUERY_SECRET.sub(r"\1***", text)


def url_password(url: str | None) -> str | None:
    """The password in a URL (`scheme://user:PASSWORD@`, `?password=`) or a libpq connection string
    (`postgresql://...`, or `password=...` among its keywords), whether or not the rest of it parses; None if it
    has none."""
    secrets = _secrets(url)
    return secrets[0] if secrets else None


def _secrets(source) -> list[str]:
    """Every password `source` (a URL or a connection string) holds, as written and as a client decodes it."""
    if not source:
        return []
    text, found = str(source), []
    if _SCHEME.match(text) or "=" not in text:  # a URL (a DSN in URI form): its userinfo
        m = _USERINFO.match(text.strip())
        if m is not None:
            _user, sep, password = m["userinfo"].partition(":")
            if sep and password:
                found.append(password)
    found += re.findall(r"[?&](?:password|pass|pwd|sslpassword)=([^&#]+)", text, re.I)
    for quoted, bare in _KEYWORD_VALUE.findall(text):  # libpq's keyword form, quoted with '...' or bare
        found.append(re.sub(r"\\(.)", r"\1", quoted) if quoted else bare)
    out = []
    for secret in found:
        for form in (secret, unquote(secret)):
            if form and form not in out:
                out.append(form)
    return out


def redact(text, *sources: str | None) -> str:
    """`text` with every password masked as `***`: each occurrence of a password that one of `sources` (URLs or
    connection strings: REDIS_URL, PG_DSN; None and empty ones are skipped) holds, raw or percent-decoded, and
    any credentials that look like one: a `scheme://user:password@` URL, a `password=` query option, a libpq
    `password=` keyword. Apply it to every error text before it is stored or printed."""
    out = str(text)
    secrets = {s for source in sources for s in _secrets(source)}
    for secret in sorted(secrets, key=len, reverse=True):
        out = out.replace(secret, "***")
    out = _IN_TEXT.sub(lambda m: m[0] if m[0].endswith(":PASSWORD@") else f"{m[1]}:***@", out)
    out = _QUERY_SECRET.sub(r"\1***", out)
    return _KEYWORD_SECRET.sub(r"\1***", out)


class ChangelogError(Exception):
    """Root of every error raised by `changelog`."""


class InvalidRecord(ChangelogError):
    """A line that is not a valid record of its topic. `reason` says why, in words a producer can act on."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class RecordTooLarge(InvalidRecord):
    """A record whose JSON line holds `size` bytes, more than the maximum record size `limit`."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"record of {size:,} bytes exceeds the maximum record size of {limit:,} bytes")
        self.size, self.limit = size, limit


class NotStored(ChangelogError):
    """The validated records of `file` could not be stored exactly as validated; none of them was committed.
    `committed`: the lines of the file before them that are committed (the pieces of a file over ingest's commit
    bound, each committed in turn), 0 when none."""

    def __init__(self, topic: str, file: str, accepted: int, cause: str, committed: int = 0):
        if committed:
            held = f"lines 1-{committed:,} are committed, nothing after them: {accepted:,} validated record(s) after"
        else:
            held = f"nothing was committed: the file's {accepted:,} validated record(s)"
        super().__init__(
            f"{topic}: {file}: {held} do not fit the topic's schema exactly ({cause}); this is a bug in mview's"
            " validation, please report it with the file"
        )
        self.topic, self.file, self.accepted, self.cause = topic, file, accepted, cause
        self.committed = committed


_NO_SPACE = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")


class IngestFailed(ChangelogError):
    """`mview ingest` of `file` into `topic` stopped at a failure it cannot go past (a full or unwritable
    `LAKE_DIR`, ...); `cause` says why, in one line. What the topic holds of the file is exact: lines 1 to
    `committed` (0: none) are committed, each record once, with every dead letter of those lines except those of
    lines `dead_letters_missing` (a (first, last) range, or None); nothing after them is. `resumable`: the same
    command goes on after line `committed` and writes the missing dead letters (a regular file); otherwise (stdin, a
    pipe) the input must be fed again from line `committed` + 1. `not_read`: the files named after it, not read."""

    def __init__(
        self,
        topic: str,
        file: str,
        cause: str,
        *,
        committed: int = 0,
        dead_letters_missing: tuple[int, int] | None = None,
        resumable: bool = True,
        not_read: int = 0,
        lake_dir: str | None = None,
    ):
        self.topic, self.file, self.cause, self.committed = topic, file, cause, committed
        self.dead_letters_missing, self.resumable, self.not_read = dead_letters_missing, resumable, not_read
        if any(s in cause for s in _NO_SPACE):
            fix = f"free space in LAKE_DIR ({lake_dir})" if lake_dir else "free space in LAKE_DIR"
        else:
            fix = "remove the cause"
        if committed == 0:
            held = "nothing of it was committed"
            again = "run the same command again" if resumable else "feed the same input again"
        else:
            held = f"lines 1-{committed:,} are committed, nothing after them"
            if dead_letters_missing:
                a, b = dead_letters_missing
                held += f", but the dead letters of lines {a:,}-{b:,} are not written"
                held += "" if resumable else " (they cannot be: stdin is read once)"
            if resumable:
                again = f"run the same command again: it goes on after line {committed:,}"
                again += " and writes those dead letters" if dead_letters_missing else ""
            else:
                again = (
                    f"feed the input again from line {committed + 1:,} on (`tail -n +{committed + 1} FILE |"
                    f" mview ingest {topic} -`)"
                )
        rest = f"; the {not_read} file(s) named after it were not read" if not_read else ""
        super().__init__(f"{topic}: {file}: {cause}: {held}; {fix} and {again}{rest}")


class UnknownTopic(ChangelogError):
    """`topic` is not a topic of the pipeline in use (`pipeline`: its file, when known); `known` are its topics."""

    def __init__(self, topic: str, known: tuple[str, ...], pipeline: str | None = None):
        where = f" of {pipeline}" if pipeline else ""
        choose = (
            f": choose one of the topics{where}: {', '.join(known)}" if known else f" in the pipeline{where}"
        )
        super().__init__(f"unknown topic {topic!r}{choose}")
        self.topic, self.known, self.pipeline = topic, tuple(known), pipeline


class ReadFrom(ChangelogError):
    """`topic` is read `from:` the topic `source` (its log is that one's): records are written to `source`. Or it is
    read from the view `view` (`source` None): its job writes it, nothing else."""

    def __init__(self, topic: str, source: str | None, view: str | None = None):
        self.topic, self.source, self.view = topic, source, view
        if source is None:
            super().__init__(
                f"topic {topic!r} is view {view!r} (`from:` in the pipeline file): the view's job writes it, "
                "no records are written to it"
            )
            return
        super().__init__(
            f"topic {topic!r} is read from {source!r} (`from:` in the pipeline file): write its records to {source!r}"
        )


class ViewNotPublished(ChangelogError):
    """`topic` is read from view `view`, and no generation of the view's job is known to read it from: the job has
    not run yet (or Redis and the lake could not be asked). Its log is resolved when a job runs
    (`jobs.core.chain`)."""

    def __init__(self, topic: str, view: str):
        self.topic, self.view = topic, view
        super().__init__(
            f"topic {topic!r} is view {view!r}, whose job has not published a generation yet: run that job first"
        )


class TopicChanged(ChangelogError):
    """The declaration of `topic` changed its fields in a way the records its log at `path` holds do not follow
    (`changes`: each change in words, e.g. "field 'amount' is double, was bigint"). Only new optional fields may
    be added to a topic that holds records; `where` is the declaration's place (`<file>:<line>: topics.<name>`)."""

    def __init__(self, topic: str, path: str, changes: list[str], where: str | None = None):
        self.topic, self.path, self.changes, self.where = topic, str(path), list(changes), where
        super().__init__(
            f"{where or 'topic ' + repr(topic)}: the declaration changed ({'; '.join(self.changes)}), but the log"
            f" {self.path} holds records of the old fields, and only new optional fields can be added to it:"
            f" declare the new fields as a new topic, or move the log's records away (e.g. to a new topic), remove"
            f" the log and ingest them again, then `mview replay` the jobs that read it"
        )


class KafkaUnavailable(ChangelogError):
    """No Kafka broker answers at `bootstrap` (KAFKA_BOOTSTRAP); `cause` is the client's reason."""

    def __init__(self, bootstrap: str, cause: str):
        super().__init__(
            f"Kafka does not answer at KAFKA_BOOTSTRAP={bootstrap} ({cause}): start a broker there (`make kafka`) "
            "or point KAFKA_BOOTSTRAP at one"
        )
        self.bootstrap, self.cause = bootstrap, cause


class NotProduced(ChangelogError):
    """Not every line published to Kafka topic `topic` was acknowledged by the broker. `acknowledged` messages
    were, each there once; the lines of `not_acknowledged` ((file, (first, last) line ranges) in the order of the
    sources, `last` None for "to the end of the file") were not: `cause` says why (the first failure; after it no
    further line is sent). A line the broker did not acknowledge is not in the topic, except one that timed out
    on its way, which it may hold: sent again, that one is there twice (the same record twice, which has the
    effect of one)."""

    _SHOWN = 10  # ranges named in the message; all of them are in `not_acknowledged`

    def __init__(
        self,
        topic: str,
        acknowledged: int,
        cause: str,
        not_acknowledged: list[tuple[str, list]] | None = None,
    ):
        self.topic, self.acknowledged, self.cause = topic, acknowledged, cause
        self.not_acknowledged = not_acknowledged or []
        shown, left = [], self._SHOWN
        for file, ranges in self.not_acknowledged:
            if left > 0:
                shown.append(f"{file} {line_ranges(ranges[:left])}")
            left -= len(ranges)
        more = f" and {-left:,} more range(s)" if left < 0 else ""
        super().__init__(
            f"{topic}: {acknowledged:,} message(s) acknowledged; not acknowledged ({cause}): line(s)"
            f" {'; '.join(shown)}{more}; send exactly those lines again"
        )


def line_ranges(ranges) -> str:
    """(first, last) line ranges for people: `1-3, 7, 20-end` (`last` None: to the end of the file)."""
    return ", ".join(f"{a:,}" + ("-end" if b is None else f"-{b:,}" if b > a else "") for a, b in ranges)


class PostgresUnavailable(ChangelogError):
    """The database to capture cannot be reached or refuses us. `dsn` is PG_DSN as shown (never its password),
    `cause` the server's or libpq's reason."""

    def __init__(self, dsn: str, cause: str):
        super().__init__(
            f"PostgreSQL at PG_DSN ({dsn}) cannot be used: {cause}; start it (`make postgres` starts a local one) or"
            " point PG_DSN at the database to capture"
        )
        self.dsn, self.cause = dsn, cause


class PostgresMisconfigured(ChangelogError):
    """PG_DSN cannot work as it is: retrying cannot help, PG_DSN (or the server's roles) must change. Permanent:
    `mview deploy cdc` refuses it and starts nothing, and a deployed `cdc` job stops with `state: failed`. The
    message never shows the password."""


class PgDsnInvalid(PostgresMisconfigured):
    """PG_DSN is not a connection string libpq can use (it does not parse, or an option's value is invalid).
    `cause` is libpq's reason with every password masked."""

    def __init__(self, cause: str, dsn: str | None = None):
        self.cause = redact(_unquoted_after_password(cause, dsn), dsn)
        super().__init__(
            f"PG_DSN is not a valid connection string ({self.cause}): correct it (`host=H port=P dbname=D user=U`"
            " and the password, or `postgresql://U:PASSWORD@H:P/D`)"
        )


def _unquoted_after_password(cause: str, dsn: str | None) -> str:
    """libpq's parse error of a keyword-form DSN quotes the piece it could not read (`missing "=" after "X"`); a
    piece that comes after the DSN's `password` keyword may be part of the password (one with a space, an
    unclosed quote), so it is shown as "***"."""
    if not dsn or _SCHEME.match(dsn) or (m := re.search(r"\bpassword\s*=", dsn, re.I)) is None:
        return cause
    tail = dsn[m.end() :]
    return re.sub(r'"([^"]*)"', lambda q: '"***"' if q[1].strip("=") and q[1] in tail else q[0], cause)


class PostgresAuthFailed(PostgresMisconfigured):
    """The server at PG_DSN refused its credentials (SQLSTATE class 28: a wrong password, an unknown role, no
    pg_hba.conf entry), or wants a password PG_DSN does not give. `dsn` is PG_DSN as shown (without its
    password), `cause` the server's reason, masked."""

    def __init__(self, dsn: str, cause: str, secret_source: str | None = None):
        self.dsn, self.cause = dsn, redact(cause, secret_source)
        super().__init__(
            f"PostgreSQL at PG_DSN ({dsn}) refused the credentials ({self.cause}): correct the user or password"
            " in PG_DSN (or the server's pg_hba.conf), then deploy again"
        )


class CdcFailed(ChangelogError):
    """Change data capture cannot go on (the table, publication or slot is not as it needs them). `reason` says
    why and what to do."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
